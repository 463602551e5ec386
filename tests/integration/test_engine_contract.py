"""One contract, every engine available here (producer/engine.py states it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from producer.engine import FakeEngine, SamplingParams

ENGINES = ["fake", "hf", pytest.param("vllm", marks=pytest.mark.gpu)]


def snapshot_of(model, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    seen, state = set(), {}
    for name, t in model.state_dict().items():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            state[name] = t.detach().cpu().contiguous()
    save_file(state, directory / "model.safetensors")
    return directory


@pytest.fixture(params=ENGINES)
async def engine(request, tiny_model_dir, tmp_path):
    if request.param == "fake":
        eng = FakeEngine(vocab_size=40, eos_token_id=1, seed=0, min_tokens=1, max_tokens=6)
        await eng.load_weights(tmp_path, 0)
    elif request.param == "hf":
        from producer.engine_hf import HFEngine

        eng = HFEngine(tiny_model_dir, device="cpu", seed=0)
        await eng.load_weights(snapshot_of(eng.model, tmp_path / "v0"), 0)
    else:
        if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
            pytest.skip("vllm needs a CUDA GPU")
        from common.config import VllmConfig
        from producer.engine_vllm import VLLMEngine

        eng = VLLMEngine(tiny_model_dir, VllmConfig(gpu_memory_utilization=0.2, enforce_eager=True), seed=0)
        await eng.load_weights(tiny_model_dir, 0)
    yield eng
    await eng.close()


async def test_every_engine_keeps_the_completion_contract(engine):
    params = SamplingParams(n=5, temperature=0.9, max_new_tokens=6, seed=1, stop_token_ids=(1,))
    out = await engine.generate([3, 4, 5], params)
    assert len(out) == 5
    for c in out:
        assert c.token_ids.dtype == np.int32
        assert c.logprobs.dtype == np.float32
        assert c.versions.dtype == np.int32
        assert 1 <= len(c.token_ids) == len(c.logprobs) == len(c.versions) <= 6
        assert np.isfinite(c.logprobs).all()
        assert (c.logprobs <= 0).all()
        assert (c.token_ids >= 0).all()
        assert (c.token_ids < engine.vocab_size).all()
        assert (c.versions == 0).all()
        assert c.finish_reason in ("stop", "length")
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == 1
            assert 1 not in c.token_ids[:-1].tolist()
        else:
            assert len(c.token_ids) == 6


async def test_every_engine_reports_the_version_it_loaded(engine, tmp_path):
    model = getattr(engine, "model", None)
    directory = snapshot_of(model, tmp_path / "v7") if model is not None else tmp_path
    await engine.load_weights(directory, 7)
    assert engine.version == 7
    out = await engine.generate([3, 4], SamplingParams(n=2, temperature=1.0, max_new_tokens=3))
    assert all((c.versions == 7).all() for c in out)
