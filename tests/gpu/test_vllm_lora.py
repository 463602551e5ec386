"""The vLLM engine with LoRA adapters on a real GPU: each published adapter is its own vLLM LoRA,
log-probs match the learner's model with that adapter, and a request in flight when a newer
adapter arrives finishes under its own version (max_staleness + 2 slots registered).

The adapters are trained and published as the learner does it (DeviceTrainer with
`model.lora.enabled` on the CPU, then `Publisher` with the adapter header), on a random Qwen2
with heads of 64; vLLM runs bf16, so agreement is at bf16 noise (mean |Δ| < 0.02), and the two
versions are told apart by a large learning rate. The engine starts before this process touches
CUDA, so vLLM can fork its engine process.

Run on a CUDA machine with vllm and peft installed: `pytest -m gpu tests/gpu/test_vllm_lora.py`.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

if importlib.util.find_spec("peft") is None:
    pytest.skip("peft is not installed", allow_module_level=True)
# vLLM's marks (gpu, the module's event loop, its start-up warnings), its skip, bf16's tolerance
from test_vllm_engine import TOL, pytestmark  # noqa: F401

from common.config import VllmConfig
from producer.engines.base import Completion, SamplingParams

MAX_STALENESS = 1


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], list[Any]]:
    """(base model dir, adapter snapshot dirs v1 and v2, the learner's models at v1 and v2),
    all on the CPU (no CUDA in this process before vLLM forks)."""
    import copy

    import torch
    from sharded_steps import batch
    from tiny_models import build_tiny_model

    from common import config as C
    from consumer.snapshots.publisher import Publisher
    from consumer.train.trainer import DeviceTrainer

    root = tmp_path_factory.mktemp("vllm-lora")
    base = build_tiny_model(root / "base", hidden=128, layers=2)
    values: dict[str, object] = {
        "model.path": str(base),
        "model.device": "cpu",
        "train.lr": 0.2,
        "model.lora.enabled": True,
        "model.lora.rank": 8,
        "sampling.max_new_tokens": 12,
        "train.prompts_per_step": 3,
        "sampling.group_size": 4,
    }
    trainer = DeviceTrainer(C.override(C.Config(), values), base)
    dirs, models = [], []
    infos: list[Any] = []
    publisher = Publisher(
        root / "snapshots", base, keep_last=5, on_published=infos.append, adapter=trainer.adapter
    )
    for version in (1, 2):
        for step in range(3):
            trainer.step(batch(10 * version + step, vocab=trainer.vocab_size))
        publisher.submit(trainer.weights(), version=version, step=version, dtype=torch.bfloat16)
        publisher.wait()
        dirs.append(Path(infos[-1].path).parent)
        models.append(copy.deepcopy(trainer.model).eval())
    publisher.close()
    return base, dirs, models


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(adapters: tuple[Path, list[Path], list[Any]]) -> AsyncIterator[Any]:
    from producer.engines.vllm import VLLMEngine

    vcfg = VllmConfig(gpu_memory_utilization=0.2, enforce_eager=True, max_model_len=512)
    eng = VLLMEngine(adapters[0], vcfg, seed=0, lora=(8, MAX_STALENESS))
    yield eng
    await eng.close()


def learner_logprobs(model: Any, prompt: list[int], c: Completion) -> np.ndarray:
    import torch

    from common.sampling.logprobs import sampled_logprobs

    ids = torch.tensor([prompt + c.token_ids.tolist()])
    with torch.no_grad():
        logits = model(ids).logits[:, len(prompt) - 1 : -1]
        lp = sampled_logprobs(logits, ids[:, len(prompt) :], temperature=1.0)
    return lp[0].double().numpy()


def mean_abs_delta(model: Any, prompt: list[int], out: list[Completion]) -> float:
    d = [learner_logprobs(model, prompt, c) - c.logprobs for c in out]
    return float(np.abs(np.concatenate(d)).mean())


async def test_each_version_samples_with_its_own_adapter(
    engine: Any, adapters: tuple[Path, list[Path], list[Any]]
):
    _, dirs, models = adapters
    prompt = [6, 7, 8, 9]
    params = SamplingParams(n=16, temperature=1.0, max_new_tokens=48)
    await engine.load_weights(dirs[0], 1)
    assert engine.last_mode == "lora"
    out1 = await engine.generate(prompt, params)
    await engine.load_weights(dirs[1], 2)
    out2 = await engine.generate(prompt, params)
    assert all((c.versions == 1).all() for c in out1)
    assert all((c.versions == 2).all() for c in out2)
    assert mean_abs_delta(models[0], prompt, out1) < TOL
    assert mean_abs_delta(models[1], prompt, out2) < TOL
    assert mean_abs_delta(models[0], prompt, out2) > 5 * TOL  # v2's adapter, not v1's


async def test_a_request_in_flight_finishes_under_its_own_version(
    engine: Any, adapters: tuple[Path, list[Path], list[Any]]
):
    _, dirs, models = adapters
    await engine.load_weights(dirs[0], 11)  # v1's adapter again, as version 11
    prompts = [[6 + i % 30, 7, 8] for i in range(16)]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=400)
    tasks = [asyncio.create_task(engine.generate(p, params)) for p in prompts]
    await asyncio.sleep(0.3)
    await engine.load_weights(dirs[1], 12)
    assert engine.last_pause_s == 0.0  # nothing paused: the new adapter is only registered
    groups = await asyncio.gather(*tasks)
    for prompt, out in zip(prompts, groups, strict=True):
        assert all((c.versions == 11).all() for c in out)
        assert mean_abs_delta(models[0], prompt, out) < TOL
