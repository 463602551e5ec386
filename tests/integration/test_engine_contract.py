"""One contract, every engine available here (producer/engines/base.py states it).

`fake` always runs; `hf` runs on a tiny random Qwen2 built by conftest; `vllm` only on a CUDA
machine with vllm installed (`gpu` marker). The tiny model's own directory is a valid snapshot
(`save_pretrained` writes `model.safetensors` with the tied `lm_head.weight` left out).
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import torch

from common.sampling import kept_set
from common.sampling.kept_set import Truncation
from producer.engines.base import Engine, SamplingParams
from producer.engines.fake import FakeEngine

EOS = 1  # the tiny model's "<eos>", also the fake engine's
MAX_NEW = 6
STOPS = tuple(range(1, 10))  # a fifth of the tiny vocabulary: both finish reasons show up
TRUNCATION = Truncation(top_k=10, top_p=0.9, max_kept=12)


@pytest.fixture(params=["fake", "hf", pytest.param("vllm", marks=pytest.mark.gpu)])
async def engine(request: pytest.FixtureRequest, tiny_model_dir: Path) -> AsyncIterator[Engine]:
    """A fresh engine of each kind, no weights loaded yet."""
    if request.param == "fake":
        eng: Engine = FakeEngine(
            vocab_size=46, eos_token_id=EOS, seed=0, min_tokens=1, max_tokens=MAX_NEW
        )
    elif request.param == "hf":
        from producer.engines.hf import HFEngine

        eng = HFEngine(tiny_model_dir, device="cpu", seed=0)
    else:
        if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
            pytest.skip("the vllm engine needs vllm and a CUDA GPU")
        from common.config import VllmConfig
        from producer.engines.vllm import VLLMEngine

        cfg = VllmConfig(gpu_memory_utilization=0.2, enforce_eager=True)
        eng = VLLMEngine(tiny_model_dir, cfg, seed=0, truncation=TRUNCATION)
    yield eng
    await eng.close()


async def test_every_engine_reports_the_version_it_loaded(engine: Engine, tiny_model_dir: Path):
    assert engine.version == -1
    await engine.load_weights(tiny_model_dir, 0)
    assert engine.version == 0
    out = await engine.generate([3, 4], SamplingParams(n=2, temperature=1.0, max_new_tokens=3))
    assert all((c.versions == 0).all() for c in out)
    await engine.load_weights(tiny_model_dir, 7)
    assert engine.version == 7
    out = await engine.generate([3, 4], SamplingParams(n=2, temperature=1.0, max_new_tokens=3))
    assert all((c.versions == 7).all() for c in out)


async def test_every_engine_keeps_the_completion_contract(engine: Engine, tiny_model_dir: Path):
    await engine.load_weights(tiny_model_dir, 0)
    params = SamplingParams(
        n=16, temperature=0.9, max_new_tokens=MAX_NEW, seed=1, stop_token_ids=STOPS
    )
    out = await engine.generate([3, 4, 5], params)
    assert len(out) == params.n
    for c in out:
        assert c.token_ids.dtype == np.int32
        assert c.logprobs.dtype == np.float32
        assert c.versions.dtype == np.int32
        assert 1 <= len(c.token_ids) == len(c.logprobs) == len(c.versions) <= MAX_NEW
        assert np.isfinite(c.logprobs).all()
        assert (c.logprobs <= 0).all()
        assert ((c.token_ids >= 0) & (c.token_ids < engine.vocab_size)).all()
        assert (c.versions == 0).all()
        if c.finish_reason == "stop":
            assert int(c.token_ids[-1]) in STOPS  # the stop token is part of the completion
        else:
            assert c.finish_reason == "length"
            assert len(c.token_ids) == MAX_NEW
    assert {c.finish_reason for c in out} == {"stop", "length"}

    assert all(not c.kept.present for c in out)  # untruncated: no kept sets


async def test_every_engine_records_a_kept_set_per_token_when_sampling_truncated(
    engine: Engine, tiny_model_dir: Path
):
    await engine.load_weights(tiny_model_dir, 0)
    params = SamplingParams(
        n=16, temperature=0.9, max_new_tokens=MAX_NEW, seed=2, truncation=TRUNCATION
    )
    out = await engine.generate([3, 4, 5], params)
    for c in out:
        assert c.kept.present
        problem = kept_set.encoding_problem(
            c.kept, c.token_ids, vocab_size=engine.vocab_size, max_kept=TRUNCATION.max_kept
        )
        assert problem is None
        assert (c.kept.sizes()[c.kept.trained(len(c.token_ids))] <= 10).all()  # top_k 10
        assert np.isfinite(c.logprobs).all()
        assert (c.logprobs <= 0).all()
