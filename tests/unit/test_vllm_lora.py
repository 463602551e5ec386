"""The vllm engine's LoRA adapters without a GPU: which versions stay registered (pure), and the
engine on a stand-in AsyncLLM: one adapter per version, in-flight requests finish under their
own version, nothing paused or reloaded, adapters of another base or for an engine started
without LoRA refused. On a GPU: tests/gpu/test_vllm_lora.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file
from test_engine_vllm import CompletionOutput, FakeAsyncLLM, Logprob, RequestOutput, logp_of
from test_engine_vllm import write_checkpoint as write_base

from common.config import VllmConfig
from common.errors import SnapshotMismatch
from common.weights import adapter as fmt
from producer.engines import vllm_lora
from producer.engines.base import SamplingParams
from producer.engines.vllm import VLLMEngine

SPEC = fmt.AdapterSpec(rank=4, alpha=8, target_modules=["q_proj"])


# ------------------------------------------------------------------------------ pure parts
def test_the_newest_versions_and_those_in_use_stay_registered():
    slots = vllm_lora.Slots(keep=2)  # max_staleness 1
    assert [slots.add(v) for v in (0, 1, 2)] == [True, True, True]
    assert slots.add(2) is False
    assert slots.retire(in_use={0}) == []  # v0 still samples a request in flight
    assert slots.retire(in_use=set()) == [0]
    assert slots.registered == [1, 2]
    slots.add(3)
    assert slots.retire(in_use={1, 3}) == []
    slots.add(4)
    assert slots.retire(in_use={3}) == [1, 2]
    assert slots.registered == [3, 4]


@pytest.mark.parametrize(("rank", "max_rank"), [(1, 1), (4, 8), (8, 8), (16, 16), (100, 128)])
def test_engine_kwargs_enable_lora_with_a_slot_per_version_in_use_and_one_more(rank, max_rank):
    kw = vllm_lora.engine_kwargs(rank, max_staleness=2)
    assert kw == {
        "enable_lora": True,
        "max_lora_rank": max_rank,
        "max_loras": 4,
        "max_cpu_loras": 4,
    }
    with pytest.raises(ValueError, match="up to 512"):
        vllm_lora.engine_kwargs(1024, max_staleness=0)


# ------------------------------------------------------------------------------ the engine
@dataclass
class FakeLoraLLM(FakeAsyncLLM):
    """vLLM's client with LoRA: each request's tokens carry the log-prob of its adapter's
    version (`logp_of`), whatever is registered later."""

    added: list[str] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    lora_of: dict[str, Any] = field(default_factory=dict)
    files: list[list[str]] = field(default_factory=list)  # each added adapter's directory

    async def add_lora(self, request: Any) -> bool:
        self.added.append(request["name"])
        self.files.append(sorted(p.name for p in Path(request["path"]).iterdir()))  # noqa: ASYNC240
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.removed.append(lora_id - 1)
        return True

    async def generate(self, prompt: dict, sampling: dict, request_id: str, lora_request=None):  # type: ignore[no-untyped-def]
        self.lora_of[request_id] = lora_request
        async for out in super().generate(prompt, sampling, request_id):
            yield out

    async def _produce(self, deliver: Any, sampling: dict, request_id: str) -> None:
        loop = asyncio.get_running_loop()
        version = self.lora_of[request_id]["id"] - 1
        n, length = sampling["n"], sampling["max_tokens"]
        for step in range(length):
            await asyncio.sleep(self.step_s)
            last = step == length - 1
            for j in range(n):
                c = CompletionOutput(j, [7], [{7: Logprob(logp_of(version))}])
                c.finish_reason = "length" if last else None
                out = RequestOutput(request_id, [c], finished=last and j == n - 1)
                loop.call_later(self.transit_s, deliver, out)


def write_adapter(root: Path, version: int, base: str) -> Path:
    directory = root / f"v{version:06d}"
    directory.mkdir(parents=True)
    a, b = fmt.tensor_names("model.layers.0.self_attn.q_proj")
    tensors = {a: np.zeros((4, 8), np.float32), b: np.zeros((8, 4), np.float32)}
    save_file(tensors, directory / "model.safetensors", metadata=fmt.metadata(SPEC, base))
    return directory


def make(base_dir: Path, llm: FakeAsyncLLM, lora: tuple[int, int] | None) -> VLLMEngine:
    return VLLMEngine(
        base_dir,
        VllmConfig(),
        llm=llm,
        make_sampling=lambda kw, stream: {**kw, "stream": stream},
        lora=lora,
        make_lora=lambda name, lora_id, path: {"name": name, "id": lora_id, "path": path},
    )


async def test_in_flight_requests_finish_under_their_own_adapter(tmp_path: Path):
    base = write_base(tmp_path / "base")
    own = fmt.base_hash(base)
    llm = FakeLoraLLM()
    engine = make(base, llm, lora=(4, 1))  # max_staleness 1: two kept, three slots
    async with asyncio.timeout(30):
        await engine.load_weights(write_adapter(tmp_path, 0, own), 0)
        long = asyncio.create_task(engine.generate([1, 2], SamplingParams(2, 1.0, 40)))
        await asyncio.sleep(0.02)
        for v in (1, 2, 3):  # published while the v0 request samples
            await engine.load_weights(write_adapter(tmp_path, v, own), v)
        assert llm.added == ["v0", "v1", "v2", "v3"]
        peft_files = [fmt.PEFT_CONFIG_FILE, fmt.PEFT_WEIGHTS_FILE, "model.safetensors"]
        assert llm.files == [peft_files] * 4
        assert llm.removed == [1]  # not v0: its request is still in flight
        short = await engine.generate([3], SamplingParams(2, 1.0, 3))
        first = await long
        await engine.load_weights(write_adapter(tmp_path, 4, own), 4)
        assert llm.removed == [1, 0, 2]
        await engine.close()
    for c in first:  # every token of the v0 request: version 0, sampled with v0's adapter
        assert set(c.versions.tolist()) == {0}
        assert np.allclose(c.logprobs, logp_of(0))
    for c in short:
        assert set(c.versions.tolist()) == {3}
        assert np.allclose(c.logprobs, logp_of(3))
    assert not [e for e in llm.events if e.startswith(("pause", "rpc", "reset"))]
    assert engine.version == 4
    assert engine.last_mode == "lora"


async def test_adapters_of_another_base_or_without_lora_are_refused(tmp_path: Path):
    base = write_base(tmp_path / "base")
    engine = make(base, FakeLoraLLM(), lora=(4, 0))
    plain = make(base, FakeLoraLLM(), lora=None)
    async with asyncio.timeout(30):
        with pytest.raises(fmt.AdapterBaseMismatch, match="another base model"):
            await engine.load_weights(write_adapter(tmp_path / "a", 0, "f" * 64), 0)
        assert engine.version == -1
        with pytest.raises(SnapshotMismatch, match="started without LoRA"):
            await plain.load_weights(write_adapter(tmp_path / "b", 0, fmt.base_hash(base)), 0)
        too_big = make(base, FakeLoraLLM(), lora=(1, 0))  # max_lora_rank 1 < the adapter's 4
        with pytest.raises(SnapshotMismatch, match="max_lora_rank"):
            await too_big.load_weights(write_adapter(tmp_path / "c", 0, fmt.base_hash(base)), 0)
        for e in (engine, plain, too_big):
            await e.close()
