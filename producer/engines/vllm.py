"""The `vllm` engine: vLLM's `AsyncLLM` behind the `Engine` protocol, with in-place reloads.

Owns: turning our `SamplingParams` into vLLM requests for the `n = G` samples of a group, many
groups in flight at once (vLLM batches them continuously), converting vLLM's outputs into
`Completion`s (producer/engines/vllm_outputs.py; kept sets: vllm_kept.py), and switching weights in
place with per-token versions. Does not own: fetching or hash-checking snapshots
(common/weights/snapshot.py and the producer loop do that before `load_weights`).

Sampling: `logprobs_mode="processed_logprobs"` makes vLLM report log-probs of the sampling
distribution, `log_softmax(logits / T)`, the learner's rule
(`common.sampling.logprobs.sampled_logprobs`). Untruncated, requests ask for `logprobs=0` (the
sampled token only). With top-k, top-p or min-p (`params.truncation`), they also ask for the
max_kept + 1 best processed log-probs, from which producer/engines/vllm_kept.py takes each token's
kept set and log q (the engine arg
`max_logprobs` is raised to match; releases before 0.24 are refused at start).
`generation_config="vllm"` keeps a checkpoint's `generation_config.json` from changing these
settings. Requests ask for `flat_logprobs=True` and `detokenize=False`.

Two request paths; both know, at a weight switch, how many tokens each sample had received:
- final (used when vLLM's client exposes its per-request token counts, `client_token_counter`;
  vLLM 0.24 does): one request per sample (`n = 1`, seed + index when seeded, as vLLM's own
  fan-out does), `FINAL_ONLY` outputs; at a switch the counts are read from vLLM's output
  processor. Nothing is built per token beyond what vLLM builds anyway.
- stream (fallback): one request with `n = G`, `DELTA` outputs counted as they arrive. Measured
  on vLLM 0.24's real output processor (CPU, simulated engine core): about 3.5x the client CPU
  per token of FINAL_ONLY, which can make the client the bottleneck of a small, fast model.

Weight switch (`load_weights`), serialised by a lock; new `generate` calls wait at a gate while
it runs. The mode is `reload_mode(in_flight, vcfg.inflight_updates)`:
- "inflight": `pause_generation(mode="keep", clear_cache=True)` freezes running requests and
  drops all KV, `collective_rpc("reload_weights", weights_path=dir)` loads in place, then
  `resume_generation()`: frozen requests recompute their KV with the new weights. (Without
  `clear_cache` they would continue on old-weight KV: |Δ logprob| 0.66 measured.)
- "idle": reload, then `reset_prefix_cache()` (a stale prefix cache gave |Δ| 0.65 measured).
  If vLLM still holds KV (it returns False, e.g. an abort in transit), the cache is cleared
  through a pause/resume instead.
- "drain" (inflight_updates off): wait until our in-flight requests finish, then as "idle".

Per-token versions, exact: a paused engine does not step, so every token sampled before the
pause was sampled with the old weights. Those tokens can still be in transit when
`pause_generation` returns: the engine process sends step outputs and the pause's reply on one
ordered socket, but the client resolves the reply at once while step outputs wait in a queue
for vLLM's output-handler task and then in per-request collectors for our `generate` tasks. So
the boundary is taken only after the reload RPC has returned (tens of ms later, all of it event
loop time in which those tasks run) and the token counts have stopped moving (`_settle`):
`RequestTrack.switch` records, per sample, (tokens received, new version); tokens from that
index on carry the new version. A sample vLLM no longer (or not yet) knows counts as finished
if its final output reached us, else as not started (0): a finished sample's final output is
delivered in the same window. Requests waiting at the gate start after the switch and carry
the new version from their first token (which may be newer than `version` when they called).

Invariants (besides the contract in producer/engines/base.py):
- `version` is -1 until the first `load_weights`; it changes only at a recorded boundary.
- A snapshot is checked against the checkpoint the engine started from (tensor names and
  shapes, from the safetensors headers: `common.weights.snapshot.check_fits`) before anything is
  loaded: vLLM itself would only log a warning for a missing tensor and keep the old one. A
  failed reload raises `SnapshotError`; the version stays, generation is resumed, the gate
  reopens (vLLM copies tensor by tensor, so a file that fails halfway may have replaced some
  weights; the pre-check makes that rare).
- vLLM is imported only when an engine is built, so this module imports without it.
- A LoRA run's snapshots are adapters: each is registered as its own vLLM LoRA and requests
  sample with the one the engine held when they started; nothing is reloaded or paused
  (producer/engines/vllm_lora.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from common.config import VllmConfig
from common.errors import ConfigError, SnapshotError, SnapshotMismatch
from common.sampling.kept_set import NO_TRUNCATION, Truncation
from common.weights import adapter as adapter_format
from common.weights import snapshot as snap
from producer.engines import vllm_kept, vllm_lora
from producer.engines.base import Completion, SamplingParams
from producer.engines.vllm_outputs import (
    RequestTrack,
    client_token_counter,
)

log = logging.getLogger(__name__)

INSTALL_HINT = "install with pip install -e '.[vllm]' on a CUDA machine"
ReloadMode = Literal["inflight", "idle", "drain"]
TIED_OPTIONAL = ("lm_head.weight",)  # tied models: vLLM ignores it; save_pretrained omits it


def import_vllm() -> Any:
    """The vllm module, or a ConfigError that says how to get it."""
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(
            f"producer.engine = 'vllm' needs vLLM, which is not installed here: {INSTALL_HINT}"
        ) from exc
    return vllm


# ------------------------------------------------------------------------------ pure parts
def engine_kwargs(
    model_dir: Path, vcfg: VllmConfig, *, seed: int, truncation: Truncation = NO_TRUNCATION
) -> dict[str, Any]:
    """`AsyncEngineArgs` keyword arguments; `max_model_len` capped at the model's positions;
    `max_logprobs` raised to the candidates a truncated request asks for."""
    max_len = vcfg.max_model_len
    config = json.loads((Path(model_dir) / "config.json").read_text())
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and positions < max_len:
        log.info("vllm.max_model_len %d capped at the model's %d positions", max_len, positions)
        max_len = positions
    kw: dict[str, Any] = {
        "model": str(model_dir),
        "dtype": vcfg.dtype,
        "gpu_memory_utilization": vcfg.gpu_memory_utilization,
        "max_model_len": max_len,
        "enforce_eager": vcfg.enforce_eager,
        "max_num_seqs": vcfg.max_num_seqs,
        "seed": seed,
        "logprobs_mode": "processed_logprobs",
        "generation_config": "vllm",
        "enable_prefix_caching": True,
    }
    if vcfg.attention_backend:
        kw["attention_backend"] = vcfg.attention_backend
    if truncation.active:  # vLLM's default is 20; the vocabulary caps what a request asks
        vocab = config.get("vocab_size")
        vocab = vocab if isinstance(vocab, int) else 1 << 30
        kw["max_logprobs"] = max(20, vllm_kept.num_candidates(truncation, vocab))
    return kw


def sampling_kwargs(
    params: SamplingParams, *, index: int | None = None, vocab_size: int = 1 << 30
) -> dict[str, Any]:
    """`vllm.SamplingParams` keyword arguments (the caller adds output_kind): the whole group,
    or with `index` its sample `index` alone (n = 1, seed + index), as vLLM's fan-out does.
    Truncation (and the candidates that give the kept sets): `vllm_kept.request_kwargs`."""
    assert params.n >= 1
    assert params.max_new_tokens >= 1
    assert params.temperature >= 0, "config validation keeps temperatures >= 0 (0: greedy)"
    seed = params.seed
    if index is not None and seed is not None:
        seed += index
    return {
        "n": params.n if index is None else 1,
        "temperature": params.temperature,
        **vllm_kept.request_kwargs(params.truncation, vocab_size),  # top_p, top_k, min_p, logprobs
        "max_tokens": params.max_new_tokens,
        "seed": seed,
        "stop_token_ids": list(params.stop_token_ids),
        "flat_logprobs": True,  # a few flat lists per sample instead of a dict per token
        "detokenize": False,
    }


def reload_mode(num_in_flight: int, inflight_updates: bool) -> ReloadMode:
    if num_in_flight == 0:
        return "idle"
    return "inflight" if inflight_updates else "drain"


# ------------------------------------------------------------------------------ the engine
def close_client_context(llm: Any) -> None:
    """Terminate the ZeroMQ context of vLLM's engine-core client after `shutdown()`.

    vLLM's client (`llm.engine_core.resources.ctx`, 0.11 to 0.24) closes its sockets on shutdown
    but leaves the context to the garbage collector, whose `zmq.Context.__del__` then warns
    (ResourceWarning "unclosed context"): an error in a test session that treats warnings as
    errors, at whatever point the collector runs. A client without that attribute is left as is.
    """
    import zmq

    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    ctx = getattr(resources, "ctx", None)
    if isinstance(ctx, zmq.Context) and not ctx.closed:
        ctx.destroy(linger=0)


def start_async_llm(
    model_dir: Path,
    vcfg: VllmConfig,
    *,
    seed: int,
    truncation: Truncation = NO_TRUNCATION,
    lora: dict[str, Any] | None = None,
) -> Any:
    """Start vLLM's AsyncLLM on `model_dir` (forks the engine process unless CUDA is up here);
    `ConfigError` first when this vLLM cannot record the kept sets `truncation` needs."""
    vllm = import_vllm()
    problem = vllm_kept.support_problem(str(vllm.__version__)) if truncation.active else None
    if problem is not None:
        raise ConfigError(problem)
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    kwargs = engine_kwargs(model_dir, vcfg, seed=seed, truncation=truncation) | (lora or {})
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))


def lora_request(name: str, lora_int_id: int, path: str) -> Any:
    """A `vllm.lora.request.LoRARequest` (one version's adapter)."""
    import_vllm()
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=name, lora_int_id=lora_int_id, lora_path=path)


def vllm_sampling_params(kwargs: dict[str, Any], stream: bool) -> Any:
    """A `vllm.SamplingParams` from `sampling_kwargs`: DELTA outputs if `stream`, else final."""
    vllm = import_vllm()
    from vllm.sampling_params import RequestOutputKind

    kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
    return vllm.SamplingParams(**kwargs, output_kind=kind)


class VLLMEngine:
    """vLLM's AsyncLLM behind the `Engine` protocol (producer/engines/base.py); see the module doc.

    Metrics of the last weight switch: `last_mode`, `last_wait_s` (waiting for requests to
    finish, "drain" only), `last_pause_s` (no token generated: pause to resume, or the idle
    switch), `last_reload_s` (the reload RPC alone). `llm` takes an already started AsyncLLM
    (or, with `make_sampling`, a stand-in in CPU tests) instead of starting one.
    """

    def __init__(
        self,
        model_dir: Path,
        vcfg: VllmConfig,
        *,
        seed: int = 0,
        truncation: Truncation = NO_TRUNCATION,
        llm: Any = None,
        make_sampling: Callable[[dict[str, Any], bool], Any] = vllm_sampling_params,
        lora: tuple[int, int] | None = None,
        make_lora: Callable[[str, int, str], Any] | None = None,
    ) -> None:
        self._vcfg = vcfg
        self._model_dir = Path(model_dir)
        # LoRA (rank, max_staleness): one adapter per version, no reload (vllm_lora.py)
        self._lora_kwargs = vllm_lora.engine_kwargs(*lora) if lora else None
        self._slots = vllm_lora.Slots(keep=lora[1] + 1) if lora else None
        self._make_lora = make_lora or lora_request
        self._lora_request: Any = None  # the adapter new requests sample with
        self._adapters = Path(tempfile.mkdtemp(prefix="asyncgrpo-vllm-lora-")) if lora else None
        self._versions: dict[str, int] = {}  # request id -> the version it samples with
        self._truncation = truncation  # what the engine was started for (max_logprobs)
        self._make_sampling = make_sampling
        self._base_shapes = snap.tensor_shapes(Path(model_dir))
        config = json.loads((Path(model_dir) / "config.json").read_text())
        self._optional = TIED_OPTIONAL if config.get("tie_word_embeddings") else ()
        self._llm = (
            llm
            if llm is not None
            else start_async_llm(
                Path(model_dir), vcfg, seed=seed, truncation=truncation, lora=self._lora_kwargs
            )
        )
        self._vocab = int(self._llm.model_config.get_vocab_size())
        self._count = client_token_counter(self._llm)  # None: stream deltas
        self._version = -1
        self._ids = itertools.count()
        self._id_prefix = f"asyncgrpo-{os.getpid()}-{id(self):x}"
        self._active: dict[str, RequestTrack] = {}
        self._open = asyncio.Event()  # cleared while weights switch: new requests wait
        self._open.set()
        self._idle = asyncio.Event()  # set when no request is in flight
        self._idle.set()
        self._switch_lock = asyncio.Lock()
        self._closed = False
        self.last_mode = ""
        self.last_wait_s = self.last_pause_s = self.last_reload_s = 0.0

    @property
    def version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def num_in_flight(self) -> int:
        return len(self._active)

    @property
    def request_path(self) -> str:
        """`final` (one request per sample, final outputs) or `stream` (see the module doc)."""
        return "stream" if self._count is None else "final"

    @property
    def async_llm(self) -> Any:
        """The underlying AsyncLLM (benchmarks compare against it; nothing else should use it)."""
        return self._llm

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        """`params.n` samples of one prompt (request paths: module doc)."""
        assert len(prompt_ids) >= 1, "an empty prompt has nothing to condition on"
        trunc = params.truncation
        assert not trunc.active or trunc.max_kept <= self._truncation.max_kept, (
            "the engine's max_logprobs was set for a smaller max_kept"
        )
        while not self._open.is_set():  # a weight switch is running: start after it
            await self._open.wait()
        request_id = f"{self._id_prefix}-{next(self._ids)}"
        prompt = {"prompt_token_ids": list(prompt_ids)}
        children = None if self._count is None else [f"{request_id}-{j}" for j in range(params.n)]
        track = RequestTrack(
            params.n, self._version, children, truncation=trunc, vocab_size=self._vocab
        )
        self._active[request_id] = track
        self._versions[request_id] = self._version
        adapter = {"lora_request": self._lora_request} if self._lora_request is not None else {}
        self._idle.clear()
        try:
            if children is None:
                kwargs = sampling_kwargs(params, vocab_size=self._vocab)
                sampling = self._make_sampling(kwargs, True)
                async for output in self._llm.generate(prompt, sampling, request_id, **adapter):
                    track.add(output)
            else:
                await self._final_outputs(prompt, params, children, track, adapter)
        finally:
            del self._active[request_id]
            del self._versions[request_id]
            if not self._active:
                self._idle.set()
        return track.completions()

    async def _final_outputs(
        self,
        prompt: dict[str, Any],
        params: SamplingParams,
        children: list[str],
        track: RequestTrack,
        adapter: dict[str, Any],
    ) -> None:
        async def one(index: int, child_id: str) -> None:
            kwargs = sampling_kwargs(params, index=index, vocab_size=self._vocab)
            sampling = self._make_sampling(kwargs, False)
            final = None
            async for output in self._llm.generate(prompt, sampling, child_id, **adapter):
                final = output
            track.add(final, index)

        tasks = [asyncio.ensure_future(one(j, child)) for j, child in enumerate(children)]
        try:
            await asyncio.gather(*tasks)
        finally:  # an error or a cancellation stops the siblings (vLLM aborts them)
            for task in tasks:
                task.cancel()

    async def load_weights(self, directory: Path, version: int) -> None:
        """Switch to `directory`'s weights in place; mode and metrics as in the module doc."""
        directory = Path(directory)
        header = adapter_format.read_header(directory / snap.WEIGHTS_FILE)
        if header is not None:  # a LoRA run: a new adapter, no reload (vllm_lora.py)
            async with self._switch_lock:
                await self._add_adapter(directory, version, header)
            return
        shapes = snap.tensor_shapes(directory)
        snap.check_fits(shapes, self._base_shapes, directory, optional=self._optional)
        async with self._switch_lock:
            self._open.clear()
            try:
                await self._switch(directory, version)
            finally:
                self._open.set()

    async def _add_adapter(
        self, directory: Path, version: int, header: adapter_format.AdapterHeader
    ) -> None:
        """Register `directory`'s adapter as `version`'s; requests from now on sample with it,
        those in flight keep theirs; adapters no longer needed are removed."""
        if self._slots is None or self._adapters is None or self._lora_kwargs is None:
            raise SnapshotMismatch(
                "the learner publishes LoRA adapters and this producer's vLLM was started "
                "without LoRA: give the producer the run's model.lora settings (--config "
                "RUN/config.toml, or --set model.lora.enabled=true --set model.lora.rank=R)"
            )
        if header.spec.rank > self._lora_kwargs["max_lora_rank"]:
            raise SnapshotMismatch(
                f"adapter {directory}: rank {header.spec.rank} > this vLLM's max_lora_rank "
                f"{self._lora_kwargs['max_lora_rank']} (model.lora.rank of the producer's config)"
            )
        own = await asyncio.to_thread(self._stage, directory, version, header)
        request = self._make_lora(f"v{version}", vllm_lora.lora_id(version), str(own))
        t0 = time.perf_counter()
        if self._slots.add(version):
            await self._llm.add_lora(request)
        self.last_reload_s = time.perf_counter() - t0
        self._lora_request = request
        self._version = version
        self.last_mode, self.last_wait_s, self.last_pause_s = "lora", 0.0, 0.0
        for old in self._slots.retire(set(self._versions.values()) | {version}):
            await self._llm.remove_lora(vllm_lora.lora_id(old))
            await asyncio.to_thread(shutil.rmtree, self._adapters / f"v{old:06d}", True)

    def _stage(self, directory: Path, version: int, header: adapter_format.AdapterHeader) -> Path:
        """Off the event loop: check the base (hashed once), then copy the verified file into
        a directory of the engine's own with peft's names (kept while registered)."""
        adapter_format.check_base(header, adapter_format.base_hash(self._model_dir), directory)
        assert self._adapters is not None
        own = self._adapters / f"v{version:06d}"
        shutil.rmtree(own, ignore_errors=True)
        own.mkdir()
        shutil.copyfile(directory / snap.WEIGHTS_FILE, own / snap.WEIGHTS_FILE)
        adapter_format.write_peft_files(own, header, str(self._model_dir))
        return own

    async def _switch(self, directory: Path, version: int) -> None:
        llm = self._llm
        mode = reload_mode(len(self._active), self._vcfg.inflight_updates)
        t_wait = time.perf_counter()
        if mode == "drain":
            await self._idle.wait()
        t_pause = time.perf_counter()
        paused = False
        try:
            if mode == "inflight":
                await llm.pause_generation(mode="keep", clear_cache=True)
                paused = True
            await self._reload(directory)
            if mode == "inflight":
                await self._settle()
            elif not await llm.reset_prefix_cache():
                log.warning("reset_prefix_cache refused (KV still held); clearing via a pause")
                await llm.pause_generation(mode="keep", clear_cache=True)
                paused = True
            self._set_version(version)
        finally:
            if paused:
                await llm.resume_generation()
        self.last_mode = mode
        self.last_wait_s = t_pause - t_wait
        self.last_pause_s = time.perf_counter() - t_pause

    async def _reload(self, directory: Path) -> None:
        t0 = time.perf_counter()
        try:
            await self._llm.collective_rpc(
                "reload_weights", kwargs={"weights_path": str(directory)}
            )
        except Exception as exc:  # the engine's error type varies; the producer keeps going
            raise SnapshotError(f"vLLM could not reload weights from {directory}: {exc}") from exc
        self.last_reload_s = time.perf_counter() - t0

    async def _settle(self, max_rounds: int = 100) -> None:
        """Let outputs already sent by the paused engine reach our tracks (see module doc)."""
        seen = -1
        for _ in range(max_rounds):
            now = sum(sum(t.counts(self._count)) for t in self._active.values())
            if now == seen:
                return
            seen = now
            for _ in range(3):
                await asyncio.sleep(0)

    def _set_version(self, version: int) -> None:
        """The boundary: no await between recording it and changing `version`."""
        for track in self._active.values():
            track.switch(version, track.counts(self._count))
        self._version = version
        self._lora_request = None  # whole weights: new requests sample without an adapter

    async def close(self) -> None:
        """Shut the engine (and its process) down, its client's ZeroMQ context too. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._llm.shutdown()
        close_client_context(self._llm)
        if self._adapters is not None:
            shutil.rmtree(self._adapters, ignore_errors=True)
