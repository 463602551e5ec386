"""The `hf` engine: a transformers causal LM sampled by our own batched loop (CPU or GPU).

Owns: sampling completions with exact sampling log-probs for every request in flight at once,
and in-place weight reloads from a snapshot's `model.safetensors`. Does not own: fetching or
hash-checking snapshots (common/weights/snapshot.py and the producer loop do that before calling
`load_weights`), nor the batch arithmetic itself (producer/engines/hf_batch.py: left-padded prefill,
per-request Gumbel-max streams, one forward per token for all rows).

Why our own loop rather than `model.generate`: the log-prob reported for a token must be exactly
that of the sampling distribution, `log_softmax(logits / temperature)` in float32, the rule the
learner applies too (`common.sampling.logprobs.sampled_logprobs`), so behaviour and learner
log-probs agree to float32 rounding for the same weights; every request must keep its own random
stream, so that its seed alone decides its completions whatever else shares the batch; and truncated
sampling must record each token's kept set exactly as it sampled from it (transformers applies min-p
after top-k and top-p, vLLM before: we follow vLLM, common/sampling/kept_set.py).

Batching: the producer runs one asyncio task per lease, each awaiting `generate`. Calls made in
the same event-loop turn reach the torch thread together (one hand-over per turn), and the thread
runs one `Batch` of all of them: each prompt prefilled once, its cache repeated n times, then one
forward per token for every row of every request; rows leave as soon as they finish. A request
that arrives while rows are decoding joins them at a token step (its prompt prefilled in one
extra forward and merged into the left-padded cache) once the rows waiting are at least as many
as the rows in flight (`may_join`, `join_at = 1`); until then it waits, at most until the batch
drains. Measured with bench/hf_engine.py (closed loop of 8 leases of G = 8, one CPU thread):
joining at every step (`join_at = 0`) cost 13% of the throughput on the demo model (short
completions of uneven length: a prefill forward at nearly every step), and `join_at = 1` kept
batch-at-a-time's rate there; on a model with long-tailed lengths the three were within the
noise of a shared CPU (±10%: a group of 8 ends with its longest row, so leases stay nearly in
step). A model whose cache is not plain full attention (sliding window, linear attention) gets
batch-at-a-time (its cache layers keep state this engine does not merge).

Seeds: `params.seed` when given (same seed, same weights, same device => same tokens, alone or
in any batch; the log-probs agree to float rounding, as a forward's shape changes its rounding),
else one derived from the engine seed and a call counter.

Invariants (besides the contract in producer/engines/base.py):
- `version` is -1 until the first `load_weights`. The producer always loads a published snapshot,
  version 0 included, before it generates; a generation before any load uses the checkpoint's
  own weights and reports version -1 for its tokens.
- All torch work runs on ONE dedicated thread and commands keep their order: a request made
  before `load_weights` runs on the old weights, one made after it on the new weights. A reload
  waits until the rows in flight have finished (no new request joins meanwhile), so a reload
  never overlaps a forward and every token of a completion has the version its request was
  admitted with. The event loop stays free for heartbeats.
- A caller that is cancelled (its lease task cancelled) withdraws its request: its rows leave the
  batch at the next token step, the other rows go on unchanged, nothing of it stays behind.
- An exception in a forward fails the requests in that batch (raised to their callers); the
  thread goes on serving the next ones.
- A LoRA snapshot (its header says so: common/weights/adapter.py) is merged into the engine's
  own copy of the base (producer/engines/hf_adapter.py); one trained on another base raises
  `AdapterBaseMismatch` and changes nothing.
- `load_weights` checks every tensor's name and shape before copying anything: a file that does
  not fit raises `SnapshotError` and leaves weights and version untouched. Tied parameters
  (`lm_head.weight` sharing storage with `model.embed_tokens.weight`) may be absent from the file,
  as `save_pretrained` writes them. Tensors are cast to the model's dtype and copied one at a
  time (no second copy of the whole model in memory).
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import queue
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from common.errors import SnapshotError
from common.host.core_board import Seat
from common.host.device import resolve_device
from common.weights import adapter as adapter_format
from common.weights import snapshot as snap
from producer.engines.base import Completion, SamplingParams
from producer.engines.hf_adapter import Adapters
from producer.engines.hf_batch import Batch, Request

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def import_for(model_dir: Path) -> None:
    """Import what building this engine and its tokenizer for `model_dir` will need, without
    building anything: transformers imports a model type's configuration, modeling and
    tokenizer modules at first use (~2 s of CPU for Llama here), so a producer calls this while
    its consumer is still starting, not after registering."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(model_dir))]  # imports it
    importlib.import_module("transformers.tokenization_utils_fast")


def eos_ids(model: Any) -> set[int]:
    """EOS ids of the model's generation_config and config (either may hold an int or a list)."""
    out: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        for e in eos if isinstance(eos, list | tuple) else [eos]:
            if e is not None:
                out.add(int(e))
    return out


@dataclass(eq=False)
class _Reload:
    path: Path
    version: int
    waiter: Any


@dataclass(eq=False)
class _Close:
    pass


_Command = Request | _Reload | _Close


class HFEngine:
    """A transformers causal LM behind the `Engine` protocol (producer/engines/base.py).

    `join_at`: see `may_join` (1 by default; 0 = join at the next token always, `math.inf` =
    batch-at-a-time). bench/hf_engine.py measures the three.
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        device: str = "auto",
        dtype: str = "float32",
        seed: int = 0,
        join_at: float = 1.0,
    ) -> None:
        from transformers import AutoModelForCausalLM

        if dtype not in DTYPES:
            raise ValueError(f"hf engine dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.device = resolve_device(device)
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype])
        self.model = model.to(self.device).eval()
        self.adapters = Adapters(self.model, model_dir)  # LoRA snapshots (hf_adapter.py)
        self._eos = eos_ids(self.model)
        pad = getattr(self.model.config, "pad_token_id", None)
        self.batch = Batch(self.model, self.device, pad_id=int(pad) if pad is not None else 0)
        self._join_at = join_at
        self._version = -1
        self._seed = seed
        self._calls = itertools.count(1)
        self._stop_tables: dict[tuple[int, ...], np.ndarray] = {}
        self._outgoing: list[_Command] = []  # made this event-loop turn, handed over together
        self._inbox: queue.SimpleQueue[list[_Command]] = queue.SimpleQueue()
        self._failure: BaseException | None = None
        self._closed = False
        self._seat: Seat | None = None  # this host's cores shared with the run (share_cores)
        self.threads_used = 0  # torch threads of the last token step (0: none yet)
        self._thread = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().num_embeddings)

    @property
    def forwards(self) -> tuple[int, int]:
        """(forwards run, rows summed over them): rows per forward = how well batching works."""
        return self.batch.num_forwards, self.batch.num_rows_forwarded

    @property
    def num_rows(self) -> int:
        """Rows in the running batch (0 when idle: nothing of a finished request stays)."""
        return self.batch.num_rows

    def share_cores(self, seat: Seat | None) -> None:
        """Take the torch threads `seat` gives (common/host/core_board.py) before every token
        step, busy while rows are in flight; None: keep the threads as they are. The torch
        thread picks it up at its next step."""
        self._seat = seat

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        """`params.n` completions of one prompt (see the module docstring for seeds and stops)."""
        assert len(prompt_ids) >= 1, "an empty prompt has nothing to condition on"
        assert params.n >= 1
        assert params.max_new_tokens >= 1
        assert params.temperature >= 0, "config validation keeps temperatures >= 0 (0: greedy)"
        call = next(self._calls)
        seed = params.seed if params.seed is not None else self._seed * 1_000_003 + call
        stops = self._stop_table(params.stop_token_ids)
        future: asyncio.Future[list[Completion]] = asyncio.get_running_loop().create_future()
        request = Request(
            prompt_ids=list(prompt_ids),
            n=params.n,
            temperature=params.temperature,
            max_new_tokens=params.max_new_tokens,
            seed=seed,
            is_stop_V=stops,
            truncation=params.truncation,
            waiter=future,
        )
        self._submit(request)
        try:
            return await future
        except asyncio.CancelledError:
            request.cancelled = True  # the thread drops its rows at the next token step
            raise

    def _stop_table(self, stop_token_ids: tuple[int, ...]) -> np.ndarray:
        """A read-only bool per vocabulary id: True for these stop ids and the model's EOS ids."""
        key = tuple(sorted(set(stop_token_ids)))
        table = self._stop_tables.get(key)
        if table is None:
            table = np.zeros(max(self.vocab_size, *self._eos, *key, 0) + 1, bool)
            table[list(self._eos | set(key))] = True
            table.flags.writeable = False
            self._stop_tables[key] = table
        return table

    def _submit(self, command: _Command) -> None:
        """Queue a command; everything queued in this event-loop turn is handed over at once."""
        if self._failure is not None:
            raise RuntimeError(f"the hf engine failed: {self._failure!r}") from self._failure
        if self._closed and not isinstance(command, _Close):
            raise RuntimeError("the hf engine is closed")
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._hand_over)
        self._outgoing.append(command)

    def _hand_over(self) -> None:
        commands, self._outgoing = self._outgoing, []
        self._inbox.put(commands)

    async def load_weights(self, directory: Path, version: int) -> None:
        """Load `directory/model.safetensors` once the rows in flight have finished."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._submit(_Reload(Path(directory) / "model.safetensors", version, future))
        await future

    async def close(self) -> None:
        """Let the requests already made finish, then stop the torch thread. Idempotent."""
        if self._closed:
            return
        self._submit(_Close())
        self._closed = True
        await asyncio.to_thread(self._thread.join)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # -- the torch thread -------------------------------------------------------------------------
    def _serve(self) -> None:
        """Run commands in order, stepping the batch between them, until `_Close`."""
        pending: deque[_Command] = deque()
        try:
            while self._serve_once(pending):
                pass
        except BaseException as exc:  # a bug here would leave every caller waiting forever
            self._failure = exc
            for request in self.batch.clear():
                _settle(request.waiter, exc)
            raise
        finally:
            while True:  # whatever is still queued will never run: tell its callers
                for command in pending:
                    if not isinstance(command, _Close):
                        _settle(command.waiter, RuntimeError("the hf engine is closed"))
                try:
                    pending = deque(self._inbox.get_nowait())
                except queue.Empty:
                    break

    def _serve_once(self, pending: deque[_Command]) -> bool:
        """One token step (or one reload); False once closed."""
        batch = self.batch
        block = batch.empty and not pending
        seat = self._seat
        if block and seat is not None:
            seat.rest()  # nothing to do: the cores go to whoever has work
        while True:  # take what has been handed over; wait only if there is nothing to do
            try:
                pending.extend(self._inbox.get(block=block))
            except queue.Empty:
                break
            block = False
        withdrawn = [r for r in batch.members if r.cancelled]
        if withdrawn:
            batch.withdraw(withdrawn)
        joining = self._joining(pending)
        if batch.empty and not joining:
            if not pending:
                return True
            command = pending.popleft()
            if isinstance(command, _Close):
                return False
            if isinstance(command, _Reload):
                self._reload(command)
            return True
        if seat is not None:
            threads = seat.work()
            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)
        self.threads_used = torch.get_num_threads()
        try:
            if joining:
                batch.admit(joining, self._version)
            for request in batch.sample():
                _settle(request.waiter, request.completions())
            if not batch.empty:
                batch.forward()
        except Exception as exc:  # a failed forward fails its batch; the next one may succeed
            failed = batch.clear()
            for request in failed + [r for r in joining if r not in failed]:
                _settle(request.waiter, exc)
        return True

    def _joining(self, pending: deque[_Command]) -> list[Request]:
        """Take the requests queued ahead of any reload or close, if they start now (`may_join`)."""
        waiting: list[Request] = []
        for command in pending:
            if not isinstance(command, Request):
                break
            waiting.append(command)
        live = [r for r in waiting if not r.cancelled]
        rows = sum(r.n for r in live)
        if not waiting or not may_join(
            self.batch.num_rows, rows, self.batch.mergeable, self._join_at
        ):
            return []
        for _ in waiting:
            pending.popleft()
        return live

    def _reload(self, command: _Reload) -> None:
        if self._seat is not None and self._version >= 0:  # work per version moved on by
            self._seat.progress(command.version - self._version)
        try:
            self._load(command.path, command.version)
        except Exception as exc:  # raised to the caller of load_weights
            _settle(command.waiter, exc)
        else:
            _settle(command.waiter, None)

    @torch.no_grad()
    def _load(self, path: Path, version: int) -> None:
        own = self.model.state_dict()
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                header = adapter_format.from_metadata(f.metadata())
                if header is not None:  # a LoRA adapter: merged into the base (hf_adapter.py)
                    self.adapters.load(f, header, path)
                    self._version = version
                    return
                shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
                check_fits(shapes, own, path)
                first = check_tied_agree(f, own, path)
                self.adapters.forget()
                for name in first:
                    own[name].copy_(f.get_tensor(name).to(own[name].dtype))
        except (OSError, SafetensorError) as exc:
            raise SnapshotError(f"cannot read snapshot {path}: {exc}") from None
        finally:
            self.batch.prefix.invalidate()  # its KV cache belongs to the weights it was made with
        self._version = version


def may_join(running_rows: int, waiting_rows: int, mergeable: bool, join_at: float) -> bool:
    """Whether requests waiting with `waiting_rows` rows start now (else after a later step).

    Into an empty batch, always. Into rows in flight (a mergeable cache only), once
    `waiting_rows >= join_at * running_rows`: a join costs one extra forward (the prefill of
    the new prompts), worth paying when it adds many rows to every later forward. With
    `join_at = 1` leases that finish at nearby steps are replaced together rather than with one
    prefill per step (what `join_at = 0` does to short completions of uneven length); the rows
    in flight only shrink, so nothing waits longer than the batch's longest row.
    """
    if running_rows == 0:
        return True
    return mergeable and waiting_rows >= join_at * running_rows


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    """From the torch thread: give `future` its result (or exception), unless nobody waits."""

    def settle() -> None:
        if future.done():  # the caller was cancelled
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    loop = future.get_loop()
    if not loop.is_closed():
        loop.call_soon_threadsafe(settle)


def check_fits(
    shapes: dict[str, tuple[int, ...]], own: dict[str, torch.Tensor], path: Path
) -> None:
    """Raise SnapshotError unless `shapes` (file) fits `own` (model state): the rule of
    `common.weights.snapshot.check_fits`, tied weights told apart by their storage."""
    model_shapes = {k: tuple(t.shape) for k, t in own.items()}
    storage = {k: _storage(t) for k, t in own.items()}
    snap.check_fits(shapes, model_shapes, path, storage=storage)


def check_tied_agree(f: Any, own: dict[str, torch.Tensor], path: Path) -> list[str]:
    """File keys to copy, one per model storage; SnapshotError if two tied names disagree."""
    by_storage: dict[int, list[str]] = {}
    for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
        by_storage.setdefault(_storage(own[name]), []).append(name)
    for names in (names for names in by_storage.values() if len(names) > 1):
        first = f.get_tensor(names[0]).to(own[names[0]].dtype)
        for other in names[1:]:
            if not torch.equal(first, f.get_tensor(other).to(own[other].dtype)):
                raise SnapshotError(f"snapshot {path}: tied {names[0]} and {other} differ")
    return [names[0] for names in by_storage.values()]


def _storage(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())
