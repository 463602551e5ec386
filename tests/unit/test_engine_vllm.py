"""CPU tests of everything around vLLM in producer/engines/vllm.py.

The pure parts (request and engine arguments, output conversion, version boundaries, snapshot
fit) are tested directly. The weight-switch orchestration runs against `FakeAsyncLLM`, a
stand-in for vLLM's AsyncLLM (the only boundary that needs a GPU): it emits one token per step
whose log-prob encodes the weights that produced it, and delivers every output `transit_s`
after producing it, also after a pause returned, as vLLM's client does. So a test can check that
each token's recorded version is the version of the weights that really sampled it. Both
request paths run: `FakeAsyncLLM` streams deltas; `FakeFinalAsyncLLM` also has the client-side
token counts of vLLM's output processor, so the engine takes the final-output path.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from common.config import Config, ProducerConfig, VllmConfig
from common.errors import ConfigError, SnapshotError
from common.weights.snapshot import check_fits, tensor_shapes
from producer.engines import make_engine
from producer.engines.base import SamplingParams
from producer.engines.vllm import VLLMEngine, engine_kwargs, reload_mode, sampling_kwargs
from producer.engines.vllm_outputs import (
    RequestTrack,
    client_token_counter,
    finish_reason,
    sampled_token_logprobs,
    token_versions,
)

TENSORS = {"model.embed_tokens.weight": (50, 8), "model.norm.weight": (8,)}


# ------------------------------------------------------------------------------ stand-ins
@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float


@dataclass
class FlatLogprobs:  # vllm.logprobs.FlatLogprobs, the fields read
    start_indices: list[int]
    token_ids: list[int]
    logprobs: list[float]
    end_indices: list[int] | None = None  # vLLM 0.24 has them; older ones only starts

    def __len__(self) -> int:
        return len(self.start_indices)

    def __add__(self, other: FlatLogprobs) -> FlatLogprobs:  # a final output's positions
        shift = len(self.token_ids)
        ends = (self.end_indices or []) + [e + shift for e in other.end_indices or []]
        return FlatLogprobs(
            self.start_indices + [s + shift for s in other.start_indices],
            self.token_ids + other.token_ids, self.logprobs + other.logprobs, ends or None,
        )  # fmt: skip


def flat(positions: list[list[tuple[int, float]]], *, ends: bool = True) -> FlatLogprobs:
    """FlatLogprobs of positions, each [(sampled id, log-prob), (top-1), (top-2), ...]."""
    starts, ids, logps, stops = [], [], [], []
    for entries in positions:
        starts.append(len(ids))
        ids += [t for t, _ in entries]
        logps += [lp for _, lp in entries]
        stops.append(len(ids))
    return FlatLogprobs(starts, ids, logps, stops if ends else None)


LOG = math.log
INF = math.inf
# K = {7, 8, 9}, q = 0.5, 0.3, 0.2; the rest of the N = 5 candidates dropped (-inf)
K789 = [(7, LOG(0.5)), (8, LOG(0.3)), (9, LOG(0.2)), (0, -INF), (1, -INF)]


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput, the fields read
    index: int
    token_ids: list[int]
    logprobs: Any
    finish_reason: str | None = None


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput, the fields read
    request_id: str
    outputs: list[CompletionOutput]
    finished: bool = False


def logp_of(weights: int) -> float:
    """The fake's log-prob for every token sampled with weights `weights`."""
    return -0.1 * (weights + 1)


@dataclass
class ClientState:  # vLLM's RequestState: `.detokenizer.num_output_tokens()`
    tokens: int = 0

    @property
    def detokenizer(self) -> ClientState:
        return self

    def num_output_tokens(self) -> int:
        return self.tokens


@dataclass
class FakeAsyncLLM:
    step_s: float = 0.002
    transit_s: float = 0.005
    reload_s: float = 0.02
    reset_ok: bool = True
    fail_reload: bool = False
    weights: int = 0
    events: list[str] = field(default_factory=list)
    in_transit: int = 0
    in_transit_at_pause: int = -1
    model_config: Any = field(default_factory=lambda: SimpleNamespace(get_vocab_size=lambda: 50))
    engine_core: Any = None  # vLLM's engine-core client: `.resources.ctx`, its ZeroMQ context

    def __post_init__(self) -> None:
        self._running = asyncio.Event()
        self._running.set()

    async def generate(self, prompt: dict, sampling: dict, request_id: str):  # type: ignore[no-untyped-def]
        self.events.append(f"add {request_id}")
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        deliver = queue.put_nowait if sampling["stream"] else self._collect(queue, request_id)
        task = asyncio.create_task(self._produce(deliver, sampling, request_id))
        try:
            while True:
                out = await queue.get()
                yield out
                if out.finished:
                    break
        finally:
            task.cancel()
        self.events.append(f"done {request_id}")

    def _collect(self, queue: asyncio.Queue, request_id: str) -> Any:
        raise AssertionError("this fake streams only")

    async def _produce(self, deliver: Any, sampling: dict, request_id: str) -> None:
        loop = asyncio.get_running_loop()
        n, length = sampling["n"], sampling["max_tokens"]
        for step in range(length):
            await asyncio.sleep(self.step_s)
            await self._running.wait()  # a paused engine takes no step
            last = step == length - 1
            for j in range(n):
                if sampling["logprobs"]:  # truncated: the sampled token, then N candidates
                    top = (K789 + [(k, -INF) for k in range(10, 60)])[: sampling["logprobs"]]
                    c = CompletionOutput(j, [7], flat([[(7, LOG(0.5)), *top]]))
                else:
                    c = CompletionOutput(j, [7], [{7: Logprob(logp_of(self.weights))}])
                c.finish_reason = "length" if last else None
                out = RequestOutput(request_id, [c], finished=last and j == n - 1)
                self.in_transit += 1
                loop.call_later(self.transit_s, self._arrive, deliver, out)

    def _arrive(self, deliver: Any, out: RequestOutput) -> None:
        self.in_transit -= 1
        deliver(out)

    async def pause_generation(self, *, mode: str, clear_cache: bool) -> None:
        self.events.append(f"pause {mode} clear_cache={clear_cache}")
        self._running.clear()
        await asyncio.sleep(0)
        self.in_transit_at_pause = self.in_transit

    async def resume_generation(self) -> None:
        self.events.append("resume")
        self._running.set()

    async def collective_rpc(self, method: str, *, kwargs: dict[str, Any]) -> None:
        self.events.append(f"rpc {method}")
        await asyncio.sleep(self.reload_s)
        if self.fail_reload:
            raise RuntimeError("worker failed")
        self.weights = int(Path(kwargs["weights_path"]).name[1:])

    async def reset_prefix_cache(self) -> bool:
        self.events.append("reset_prefix_cache")
        ok, self.reset_ok = self.reset_ok, True
        return ok

    def shutdown(self) -> None:
        self.events.append("shutdown")
        if self.engine_core is not None:  # vLLM's client closes its sockets, not its context
            for sock in self.engine_core.sockets:
                sock.close(linger=0)


@dataclass
class FakeFinalAsyncLLM(FakeAsyncLLM):
    """Also FINAL_ONLY outputs, with the client-side counts vLLM's output processor keeps."""

    output_processor: Any = field(
        default_factory=lambda: SimpleNamespace(external_req_ids={}, request_states={})
    )

    def _collect(self, queue: asyncio.Queue, request_id: str) -> Any:
        op, internal, state = self.output_processor, f"{request_id}-internal", ClientState()
        op.external_req_ids[request_id] = [internal]
        op.request_states[internal] = state
        total = CompletionOutput(0, [], [])

        def deliver(out: RequestOutput) -> None:
            for c in out.outputs:
                total.token_ids += c.token_ids
                total.logprobs = c.logprobs if not total.logprobs else total.logprobs + c.logprobs
                total.finish_reason = c.finish_reason
                state.tokens += len(c.token_ids)
            if out.finished:
                del op.request_states[internal], op.external_req_ids[request_id]
                queue.put_nowait(RequestOutput(request_id, [total], finished=True))

        return deliver


def write_checkpoint(directory: Path, tensors: dict[str, tuple[int, ...]] = TENSORS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    save_file(
        {k: np.zeros(s, np.float32) for k, s in tensors.items()}, directory / "model.safetensors"
    )
    return directory


@pytest.fixture
def base_dir(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "v0")


@pytest.fixture(params=["stream", "final"])
def fake(request: pytest.FixtureRequest) -> type[FakeAsyncLLM]:
    return FakeAsyncLLM if request.param == "stream" else FakeFinalAsyncLLM


def make(base_dir: Path, llm: FakeAsyncLLM, *, inflight: bool = True) -> VLLMEngine:
    vcfg = VllmConfig(inflight_updates=inflight)
    return VLLMEngine(
        base_dir, vcfg, llm=llm, make_sampling=lambda kw, stream: {**kw, "stream": stream}
    )


def params(n: int = 2, tokens: int = 30) -> SamplingParams:
    return SamplingParams(n=n, temperature=1.0, max_new_tokens=tokens)


def assert_versions_match_weights(completions: list, *, versions_of: dict[int, int]) -> None:
    for c in completions:
        used = [versions_of[round(-10 * x) - 1] for x in c.logprobs.tolist()]
        assert c.versions.tolist() == used


# ------------------------------------------------------------------------------ pure parts
def test_sampling_kwargs_keep_the_full_distribution_and_ask_for_sampled_logprobs():
    kw = sampling_kwargs(SamplingParams(4, 0.7, 32, seed=5, stop_token_ids=(2, 3)))
    assert kw["n"] == 4
    assert kw["flat_logprobs"] is True
    assert kw["temperature"] == 0.7
    assert kw["max_tokens"] == 32
    assert kw["seed"] == 5
    assert kw["stop_token_ids"] == [2, 3]
    assert (kw["top_p"], kw["top_k"], kw["logprobs"]) == (1.0, 0, 0)
    assert kw["detokenize"] is False


def test_one_sample_requests_get_the_seeds_vllms_fan_out_gives():
    group = SamplingParams(4, 1.0, 8, seed=10)
    assert [sampling_kwargs(group, index=j)["seed"] for j in range(4)] == [10, 11, 12, 13]
    assert sampling_kwargs(group, index=2)["n"] == 1
    assert sampling_kwargs(SamplingParams(4, 1.0, 8), index=2)["seed"] is None


def test_client_token_counts_come_from_vllms_output_processor():
    assert client_token_counter(SimpleNamespace()) is None  # an older vLLM: stream instead
    op = SimpleNamespace(
        external_req_ids={"r-0": ["r-0-abc"], "r-1": ["r-1-def"]},
        request_states={"r-0-abc": ClientState(5)},  # r-1 not registered yet
    )
    count = client_token_counter(SimpleNamespace(output_processor=op))
    assert count is not None
    assert [count("r-0"), count("r-1"), count("r-2")] == [5, 0, 0]
    track = RequestTrack(3, 0, ["r-0", "r-1", "r-2"])
    track.add(
        RequestOutput("r-2", [CompletionOutput(0, [4, 4], [{4: Logprob(-1.0)}] * 2, "stop")]), 2
    )
    assert track.counts(count) == (5, 0, 2)  # a finished sample counts what it delivered


def test_engine_kwargs_use_processed_logprobs_and_cap_the_length(base_dir: Path):
    kw = engine_kwargs(base_dir, VllmConfig(max_model_len=2048), seed=3)
    assert kw["logprobs_mode"] == "processed_logprobs"
    assert kw["generation_config"] == "vllm"
    assert kw["enable_prefix_caching"] is True
    assert kw["seed"] == 3
    assert kw["max_model_len"] == 64  # the checkpoint's max_position_embeddings
    assert "attention_backend" not in kw
    kw = engine_kwargs(
        base_dir, VllmConfig(max_model_len=32, attention_backend="FLASH_ATTN"), seed=0
    )
    assert (kw["max_model_len"], kw["attention_backend"]) == (32, "FLASH_ATTN")


@pytest.mark.parametrize(("reason", "ours"), [("stop", "stop"), ("length", "length")])
def test_finish_reasons_map_to_ours(reason: str, ours: str):
    assert finish_reason(reason) == ours


@pytest.mark.parametrize("reason", ["abort", "error", None])
def test_other_finish_reasons_are_errors(reason: str | None):
    with pytest.raises(RuntimeError, match="finished a sample"):
        finish_reason(reason)


def test_sampled_logprobs_read_dict_and_flat_containers():
    ids = [5, 9, 5]
    as_dicts = [{5: Logprob(-0.5)}, {9: Logprob(-1.5), 4: Logprob(-0.1)}, {5: Logprob(-2.0)}]
    flat = FlatLogprobs([0, 1, 2], [5, 9, 5], [-0.5, -1.5, -2.0])
    assert sampled_token_logprobs(ids, as_dicts) == [-0.5, -1.5, -2.0]
    assert sampled_token_logprobs(ids, flat) == [-0.5, -1.5, -2.0]
    assert sampled_token_logprobs([], flat) == []  # a delta with no new token


@pytest.mark.parametrize(
    ("length", "bounds", "expected"),
    [
        (4, [], [3, 3, 3, 3]),
        (4, [(2, 4)], [3, 3, 4, 4]),
        (4, [(0, 4)], [4, 4, 4, 4]),
        (4, [(4, 4)], [3, 3, 3, 3]),  # finished before the switch
        (5, [(1, 4), (3, 6)], [3, 4, 4, 6, 6]),
    ],
)
def test_token_versions_follow_the_boundaries(length, bounds, expected):
    assert token_versions(length, 3, bounds).tolist() == expected


def test_a_track_turns_deltas_into_contract_completions():
    track = RequestTrack(2, start_version=1)
    track.add(
        RequestOutput("r", [CompletionOutput(1, [4, 5], [{4: Logprob(-1.0)}, {5: Logprob(1e-7)}])])
    )
    track.add(RequestOutput("r", [CompletionOutput(0, [6], FlatLogprobs([0], [6], [-0.25]))]))
    track.switch(2, track.counts(None))
    track.add(RequestOutput("r", [CompletionOutput(0, [2], [{2: Logprob(-3.0)}], "stop")]))
    track.add(RequestOutput("r", [CompletionOutput(1, [], [], "length")], finished=True))
    first, second = track.completions()
    assert first.token_ids.tolist() == [6, 2]
    assert first.token_ids.dtype == np.int32
    assert first.logprobs.dtype == np.float32
    assert first.logprobs.tolist() == [-0.25, -3.0]
    assert first.versions.tolist() == [1, 2]
    assert first.finish_reason == "stop"
    assert second.token_ids.tolist() == [4, 5]
    assert second.logprobs.tolist() == [-1.0, 0.0]  # clamped to <= 0
    assert second.versions.tolist() == [1, 1]
    assert second.finish_reason == "length"


@pytest.mark.parametrize(
    ("in_flight", "inflight_updates", "mode"),
    [(0, True, "idle"), (0, False, "idle"), (3, True, "inflight"), (3, False, "drain")],
)
def test_reload_mode(in_flight: int, inflight_updates: bool, mode: str):
    assert reload_mode(in_flight, inflight_updates) == mode


def test_a_snapshot_must_hold_the_checkpoints_tensors(tmp_path: Path, base_dir: Path):
    base = tensor_shapes(base_dir)
    assert base == TENSORS
    tied = ("lm_head.weight",)
    check_fits(dict(base, **{"lm_head.weight": (50, 8)}), base, tmp_path, optional=tied)
    check_fits(base, dict(base, **{"lm_head.weight": (50, 8)}), tmp_path, optional=tied)
    with pytest.raises(SnapshotError, match=r"unexpected: lm_head\.weight"):
        check_fits(dict(base, **{"lm_head.weight": (50, 8)}), base, tmp_path)
    with pytest.raises(SnapshotError, match=r"missing: model\.norm\.weight"):
        check_fits({"model.embed_tokens.weight": (50, 8)}, base, tmp_path)
    with pytest.raises(SnapshotError, match="wrong shape"):
        check_fits(dict(base, **{"model.norm.weight": (9,)}), base, tmp_path)
    with pytest.raises(SnapshotError, match=r"no \*\.safetensors"):
        check_fits(tensor_shapes(tmp_path / "empty"), base, tmp_path)


def test_a_missing_vllm_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, base_dir: Path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[vllm\]' on a CUDA machine"):
        VLLMEngine(base_dir, VllmConfig())
    cfg = Config(producer=ProducerConfig(engine="vllm"))
    with pytest.raises(ConfigError, match="needs vLLM"):
        make_engine(cfg, model_dir=base_dir, vocab_size=50, seed=0)


# ------------------------------------------------------------------------------ orchestration
async def test_inflight_update_records_exact_versions_despite_outputs_in_transit(
    base_dir: Path, fake: type[FakeAsyncLLM]
):
    async with asyncio.timeout(10):
        llm = fake()
        engine = make(base_dir, llm)
        await engine.load_weights(base_dir, 0)
        tasks = [asyncio.create_task(engine.generate([1, 2], params())) for _ in range(4)]
        await asyncio.sleep(0.02)
        await engine.load_weights(write_checkpoint(base_dir.parent / "v1"), 1)
        results = await asyncio.gather(*tasks)
    assert llm.in_transit_at_pause > 0  # the case that needs care really happened
    adds = [e for e in llm.events if e.startswith("add")]
    assert len(adds) == (8 if fake is FakeFinalAsyncLLM else 4)  # one request per sample, or group
    assert engine.version == 1
    assert engine.last_mode == "inflight"
    assert engine.last_pause_s >= engine.last_reload_s >= llm.reload_s
    i = llm.events.index("pause keep clear_cache=True")
    assert llm.events[i + 1 : i + 3] == ["rpc reload_weights", "resume"]
    completions = [c for group in results for c in group]
    for c in completions:
        assert_versions_match_weights([c], versions_of={0: 0, 1: 1})
    assert all(set(c.versions.tolist()) == {0, 1} for c in completions)


async def test_idle_reload_resets_the_prefix_cache_without_pausing(
    base_dir: Path, fake: type[FakeAsyncLLM]
):
    async with asyncio.timeout(10):
        llm = fake()
        engine = make(base_dir, llm)
        await engine.load_weights(base_dir, 0)
        out = await engine.generate([1], params(n=3, tokens=4))
    assert llm.events[:2] == ["rpc reload_weights", "reset_prefix_cache"]
    assert engine.last_mode == "idle"
    assert not any(e.startswith(("pause", "resume")) for e in llm.events)
    assert [c.versions.tolist() for c in out] == [[0] * 4] * 3


async def test_a_refused_prefix_reset_clears_the_cache_through_a_pause(
    base_dir: Path, fake: type[FakeAsyncLLM]
):
    async with asyncio.timeout(10):
        llm = fake(reset_ok=False)
        engine = make(base_dir, llm)
        await engine.load_weights(base_dir, 0)
    assert llm.events == [
        "rpc reload_weights",
        "reset_prefix_cache",
        "pause keep clear_cache=True",
        "resume",
    ]
    assert engine.version == 0


async def test_without_inflight_updates_the_reload_waits_for_requests(
    base_dir: Path, fake: type[FakeAsyncLLM]
):
    async with asyncio.timeout(10):
        llm = fake()
        engine = make(base_dir, llm, inflight=False)
        await engine.load_weights(base_dir, 0)
        tasks = [asyncio.create_task(engine.generate([1], params(tokens=10))) for _ in range(3)]
        await asyncio.sleep(0.01)
        await engine.load_weights(write_checkpoint(base_dir.parent / "v1"), 1)
        old = await asyncio.gather(*tasks)
        new = await engine.generate([1], params(tokens=3))
    rpcs = [i for i, e in enumerate(llm.events) if e == "rpc reload_weights"]
    old_ids = {e[4:] for e in llm.events[: rpcs[1]] if e.startswith("add")}
    old_dones = [i for i, e in enumerate(llm.events) if e[5:] in old_ids and e.startswith("done")]
    assert len(old_dones) == len(old_ids) > 0
    assert max(old_dones) < rpcs[1] < llm.events.index("reset_prefix_cache", rpcs[1])
    assert engine.last_mode == "drain"
    assert engine.last_wait_s > 0
    assert all((c.versions == 0).all() for group in old for c in group)
    assert all((c.versions == 1).all() for c in new)
    assert not any(e.startswith("pause") for e in llm.events)


async def test_a_request_arriving_during_a_switch_starts_on_the_new_weights(
    base_dir: Path, fake: type[FakeAsyncLLM]
):
    async with asyncio.timeout(10):
        llm = fake(reload_s=0.05)
        engine = make(base_dir, llm)
        await engine.load_weights(base_dir, 0)
        switch = asyncio.create_task(
            engine.load_weights(write_checkpoint(base_dir.parent / "v1"), 1)
        )
        await asyncio.sleep(0.01)
        out = await engine.generate([1], params(n=2, tokens=5))
        await switch
    adds = [i for i, e in enumerate(llm.events) if e.startswith("add")]
    assert adds[0] > llm.events.index("reset_prefix_cache", 2)
    assert_versions_match_weights(out, versions_of={1: 1})


async def test_a_failed_reload_keeps_the_version_and_resumes(
    base_dir: Path, fake: type[FakeAsyncLLM]
):
    async with asyncio.timeout(10):
        llm = fake()
        engine = make(base_dir, llm)
        await engine.load_weights(base_dir, 0)
        task = asyncio.create_task(engine.generate([1], params(tokens=20)))
        await asyncio.sleep(0.01)
        llm.fail_reload = True
        with pytest.raises(SnapshotError, match="could not reload"):
            await engine.load_weights(write_checkpoint(base_dir.parent / "v1"), 1)
        assert llm.events[-1] == "resume"
        llm.fail_reload = False
        out = await task
        later = await engine.generate([1], params(tokens=2))  # the gate is open again
    assert engine.version == 0
    assert all((c.versions == 0).all() for c in out + later)


async def test_a_snapshot_that_does_not_fit_is_refused_before_touching_the_engine(
    base_dir: Path,
):
    async with asyncio.timeout(10):
        llm = FakeAsyncLLM()
        engine = make(base_dir, llm)
        bad = write_checkpoint(base_dir.parent / "v1", {"model.norm.weight": (8,)})
        with pytest.raises(SnapshotError, match="does not fit"):
            await engine.load_weights(bad, 1)
        await engine.close()
        await engine.close()
    assert llm.events == ["shutdown"]
    assert engine.version == -1
    assert engine.vocab_size == 50


async def test_closing_the_engine_terminates_the_clients_zeromq_context(base_dir: Path):
    """vLLM's client leaves its context to the garbage collector, whose `Context.__del__` warns
    (an error under `filterwarnings = error`, at teardown of the GPU session): close ends it."""
    import zmq

    ctx = zmq.Context()
    sockets = [ctx.socket(zmq.PULL), ctx.socket(zmq.ROUTER)]
    client = SimpleNamespace(resources=SimpleNamespace(ctx=ctx), sockets=sockets)
    async with asyncio.timeout(10):
        engine = make(base_dir, FakeAsyncLLM(engine_core=client))
        await engine.close()
        await engine.close()
    assert ctx.closed
    assert all(s.closed for s in sockets)


async def test_a_client_without_the_known_context_is_closed_as_it_is(base_dir: Path):
    llm = FakeAsyncLLM(engine_core=SimpleNamespace(sockets=[]))
    async with asyncio.timeout(10):
        await make(base_dir, llm).close()
    assert llm.events == ["shutdown"]
