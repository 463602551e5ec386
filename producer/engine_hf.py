"""The `hf` engine: a transformers causal LM sampled by our own loop (CPU or GPU).

Owns: sampling G completions of one prompt with exact sampling log-probs, and in-place weight
reloads from a snapshot's `model.safetensors`. Does not own: fetching or hash-checking snapshots
(common/snapshot.py and the producer loop do that before calling `load_weights`).

Why our own loop rather than `model.generate`: the log-prob reported for a token must be exactly
that of the sampling distribution, `log_softmax(logits / temperature)` in float32, the rule the
learner applies too (`common.logprobs.sampled_logprobs`), so behaviour and learner log-probs agree
to float32 rounding for the same weights. One step, for the n rows of a group:

    p = softmax(logits.float() / T);  token ~ multinomial(p, generator);  logp = sampled_logprobs
    logp = min(logp, 0)   (a token of probability 1 can round to +1e-8)

The prompt is prefilled once and its KV cache repeated n times (no padding: every row shares the
prompt). A row stops at its first stop token (`params.stop_token_ids` and the model's
`generation_config` / `config` EOS ids), which it keeps ("stop"), or after `max_new_tokens`
("length"); finished rows keep being fed until every row is done, their extra tokens dropped.
Seeds: `params.seed` when given (same seed, same weights, same device => same completions), else
one derived from the engine seed and a call counter.

Invariants (besides the contract in producer/engine.py):
- `version` is -1 until the first `load_weights`. The producer always loads a published snapshot,
  version 0 included, before it generates; a generation before any load uses the checkpoint's
  own weights and reports version -1 for its tokens.
- All torch work runs on ONE dedicated worker thread, in submission order. So a reload never
  overlaps a generation, even when the coroutine awaiting that generation was cancelled (the
  thread finishes the job; the next job waits for it), and the event loop stays free for
  heartbeats. A completion's `versions` is the version of the weights that thread used: the
  engine's version when the generation job started.
- `load_weights` checks every tensor's name and shape before copying anything: a file that does
  not fit raises `SnapshotError` and leaves weights and version untouched. Tied parameters
  (`lm_head.weight` sharing storage with `model.embed_tokens.weight`) may be absent from the file,
  as `save_pretrained` writes them. Tensors are cast to the model's dtype and copied one at a
  time (no second copy of the whole model in memory).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from common.errors import SnapshotError
from common.logprobs import sampled_logprobs
from producer.engine import Completion, SamplingParams

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
R = TypeVar("R")


def resolve_device(name: str) -> torch.device:
    """'auto' = cuda if available, else cpu; anything else is passed to torch."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def eos_ids(model: Any) -> set[int]:
    """EOS ids of the model's generation_config and config (either may hold an int or a list)."""
    out: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        for e in eos if isinstance(eos, list | tuple) else [eos]:
            if e is not None:
                out.add(int(e))
    return out


class HFEngine:
    """A transformers causal LM behind the `Engine` protocol (producer/engine.py)."""

    def __init__(
        self, model_dir: Path, *, device: str = "auto", dtype: str = "float32", seed: int = 0
    ) -> None:
        from transformers import AutoModelForCausalLM

        if dtype not in DTYPES:
            raise ValueError(f"hf engine dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.device = resolve_device(device)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype])
        self.model = model.to(self.device).eval()
        self._eos = eos_ids(self.model)
        self._keep_last = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._repeat_cache = True  # prefill the prompt once, repeat its KV cache n times
        self._version = -1
        self._seed = seed
        self._calls = itertools.count(1)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="hf-engine")
        self._closed = False

    @property
    def version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().num_embeddings)

    async def _on_thread(self, fn: Callable[..., R], *args: Any) -> R:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        """`params.n` completions of one prompt (see the module docstring for seeds and stops)."""
        assert len(prompt_ids) >= 1, "an empty prompt has nothing to condition on"
        assert params.n >= 1
        assert params.max_new_tokens >= 1
        assert params.temperature > 0, "config validation keeps sampling.temperature > 0"
        call = next(self._calls)
        seed = params.seed if params.seed is not None else self._seed * 1_000_003 + call
        return await self._on_thread(self._generate, prompt_ids, params, seed)

    def _generate(
        self, prompt_ids: list[int], params: SamplingParams, seed: int
    ) -> list[Completion]:
        version = self._version  # read on the torch thread: the weights this job uses
        ids_nL, logp_nL, lengths_n, stopped_n = self._sample(prompt_ids, params, seed)
        return [
            Completion(
                token_ids=ids_nL[i, :k].astype(np.int32),
                logprobs=np.minimum(logp_nL[i, :k], 0.0).astype(np.float32),
                finish_reason="stop" if stopped_n[i] else "length",
                versions=np.full(k, version, np.int32),
            )
            for i, k in enumerate(lengths_n.tolist())
        ]

    @torch.inference_mode()
    def _sample(
        self, prompt_ids: list[int], params: SamplingParams, seed: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids [n, L], logp [n, L], lengths [n], stopped [n]) with L = steps taken."""
        n, dev, temperature = params.n, self.device, params.temperature
        gen = torch.Generator(device=dev).manual_seed(seed)
        stop_ids = torch.tensor(sorted(self._eos | set(params.stop_token_ids)), device=dev)
        logits_nV, cache = self._prefill(torch.tensor([prompt_ids], device=dev), n)
        tokens, logps = [], []
        done_n = torch.zeros(n, dtype=torch.bool, device=dev)
        lengths_n = torch.full((n,), params.max_new_tokens, dtype=torch.long, device=dev)
        for step in range(params.max_new_tokens):
            probs_nV = torch.softmax(logits_nV.float() / temperature, dim=-1)
            tok_n1 = torch.multinomial(probs_nV, 1, generator=gen)
            logps.append(sampled_logprobs(logits_nV[:, None], tok_n1, temperature=temperature))
            tokens.append(tok_n1)
            newly_n = ~done_n & torch.isin(tok_n1[:, 0], stop_ids)
            lengths_n = torch.where(newly_n, step + 1, lengths_n)
            done_n |= newly_n
            if step + 1 == params.max_new_tokens or bool(done_n.all()):
                break
            out = self.model(input_ids=tok_n1, past_key_values=cache, use_cache=True)
            logits_nV, cache = out.logits[:, -1], out.past_key_values
        return (
            torch.cat(tokens, dim=1).cpu().numpy(),
            torch.cat(logps, dim=1).float().cpu().numpy(),
            lengths_n.cpu().numpy(),
            done_n.cpu().numpy(),
        )

    def _prefill(self, prompt_1P: torch.Tensor, n: int) -> tuple[torch.Tensor, Any]:
        """Last-position logits [n, V] and a KV cache of n rows, computing the prompt once."""
        keep = {"logits_to_keep": 1} if self._keep_last else {}
        if self._repeat_cache:
            out = self.model(input_ids=prompt_1P, use_cache=True, **keep)
            if hasattr(out.past_key_values, "batch_repeat_interleave"):
                out.past_key_values.batch_repeat_interleave(n)
                return out.logits[:, -1].expand(n, -1), out.past_key_values
            self._repeat_cache = False  # a legacy cache: prefill all n rows from now on
        out = self.model(input_ids=prompt_1P.expand(n, -1), use_cache=True, **keep)
        return out.logits[:, -1], out.past_key_values

    async def load_weights(self, directory: Path, version: int) -> None:
        await self._on_thread(self._load, Path(directory) / "model.safetensors", version)

    @torch.no_grad()
    def _load(self, path: Path, version: int) -> None:
        own = self.model.state_dict()
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
                check_fits(shapes, own, path)
                first = check_tied_agree(f, own, path)
                for name in first:
                    own[name].copy_(f.get_tensor(name).to(own[name].dtype))
        except (OSError, SafetensorError) as exc:
            raise SnapshotError(f"cannot read snapshot {path}: {exc}") from None
        self._version = version

    async def close(self) -> None:
        """Wait for the running job (if any), then stop the torch thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._thread.shutdown, True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def check_fits(
    shapes: dict[str, tuple[int, ...]], own: dict[str, torch.Tensor], path: Path
) -> None:
    """Raise SnapshotError unless `shapes` (file) covers `own` (model state) exactly.

    A model key may be absent from the file only when it shares storage with a key that is
    present (tied weights); every file key must exist in the model with the same shape.
    """
    unexpected = sorted(set(shapes) - set(own))
    wrong = [
        f"{k} {list(shapes[k])} != {list(own[k].shape)}"
        for k in shapes
        if k in own and shapes[k] != tuple(own[k].shape)
    ]
    written = {_storage(own[k]) for k in shapes if k in own}
    missing = [k for k in own if k not in shapes and _storage(own[k]) not in written]
    found = {"missing": missing, "unexpected": unexpected, "wrong shape": wrong}
    problems = [
        f"{label}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
        for label, keys in found.items()
        if keys
    ]
    if problems:
        raise SnapshotError(f"snapshot {path} does not fit the model ({'; '.join(problems)})")


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
