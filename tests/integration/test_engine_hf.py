"""The hf engine's behaviour log-probs equal the learner's for the same weights (float32)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from common import config as C
from common import wire
from common.errors import SnapshotError
from consumer.trainer import Trainer
from producer.engine import SamplingParams
from producer.engine_hf import HFEngine


def save_state(model, directory: Path, *, scale: float = 1.0, seed: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    seen, state = set(), {}
    for name, t in model.state_dict().items():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        noise = torch.randn(t.shape, generator=gen) * scale if scale else 0
        state[name] = (t.detach().cpu() + noise).contiguous()
    save_file(state, directory / "model.safetensors")
    return directory


def as_group(prompt: list[int], completions, temperature: float) -> wire.Group:
    return wire.Group(
        lease_id=0, producer_id="t", prompt_index=0, behavior_version=0,
        prompt_ids=np.array(prompt, np.int32),
        completion_ids=np.concatenate([c.token_ids for c in completions]),
        completion_lens=np.array([len(c.token_ids) for c in completions], np.int32),
        behavior_logp=np.concatenate([c.logprobs for c in completions]),
        token_versions=np.zeros(0, np.int32), rewards=np.zeros(len(completions), np.float32),
        finish_reasons=tuple(c.finish_reason for c in completions), temperature=temperature,
    )  # fmt: skip


def learner(model_dir: Path, temperature: float) -> Trainer:
    cfg = C.Config()
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, device="cpu"),
        sampling=dataclasses.replace(cfg.sampling, temperature=temperature),
    )
    return Trainer(cfg, model_dir)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_behaviour_logprobs_equal_the_learners_for_the_same_weights(tiny_model_dir, tmp_path, temperature):
    engine = HFEngine(tiny_model_dir, device="cpu", seed=0)
    trainer = learner(tiny_model_dir, temperature)
    await engine.load_weights(save_state(trainer.model, tmp_path / "v0", scale=0), 0)
    prompt = [3, 4, 12, 5, 15]
    params = SamplingParams(n=8, temperature=temperature, max_new_tokens=12, seed=3)
    completions = await engine.generate(prompt, params)
    recomputed = trainer.logprobs([as_group(prompt, completions, temperature)])
    for c, mine in zip(completions, recomputed, strict=True):
        assert np.abs(c.logprobs - mine).max() < 1e-4


async def test_after_a_reload_the_logprobs_follow_the_new_weights_not_the_old(tiny_model_dir, tmp_path):
    engine = HFEngine(tiny_model_dir, device="cpu", seed=0)
    trainer = learner(tiny_model_dir, 1.0)
    await engine.load_weights(save_state(trainer.model, tmp_path / "v0", scale=0), 0)
    new_dir = save_state(trainer.model, tmp_path / "v1", scale=0.05, seed=1)
    await engine.load_weights(new_dir, 1)
    prompt = [3, 4, 5]
    completions = await engine.generate(prompt, SamplingParams(n=8, temperature=1.0, max_new_tokens=12, seed=4))
    assert all((c.versions == 1).all() for c in completions)
    group = as_group(prompt, completions, 1.0)
    old = np.concatenate(trainer.logprobs([group]))
    new_trainer = learner(tiny_model_dir, 1.0)
    new_trainer.model.load_state_dict(load_file(new_dir / "model.safetensors"), strict=False)
    new = np.concatenate(new_trainer.logprobs([group]))
    behaviour = group.behavior_logp
    assert np.abs(behaviour - new).max() < 1e-4
    assert np.abs(behaviour - old).mean() > 1e-3


async def test_a_snapshot_that_does_not_fit_is_refused_and_the_old_weights_stay(tiny_model_dir, tmp_path):
    engine = HFEngine(tiny_model_dir, device="cpu", seed=0)
    await engine.load_weights(save_state(engine.model, tmp_path / "v0", scale=0), 0)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    bad = tmp_path / "bad"
    bad.mkdir()
    state = {k: v.clone() for k, v in before.items() if "embed" not in k and "lm_head" not in k}
    first = next(iter(state))
    state[first] = torch.zeros(3, 3)
    save_file(state, bad / "model.safetensors")
    with pytest.raises(SnapshotError, match="does not fit"):
        await engine.load_weights(bad, 1)
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SnapshotError):
        await engine.load_weights(tmp_path / "garbage", 1)
    assert engine.version == 0
    after = engine.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
