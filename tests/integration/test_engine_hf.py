"""The hf engine: exact sampling log-probs, seeds, stops, and verified in-place reloads.

Log-probs are checked against an independent full-sequence forward of the same weights (a model
loaded separately, `log_softmax(logits / T)` written out here) and against the learner's own
recomputation (`consumer.train.trainer.DeviceTrainer.logprobs`), float32, |Δ| < 1e-4.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import full_forward_logprobs, reference_model, write_snapshot

from common import config as C
from common import wire
from common.errors import SnapshotError
from consumer.snapshots.publisher import Publisher
from producer.engines.base import SamplingParams
from producer.engines.hf import HFEngine

PROMPT = [3, 4, 12, 5, 15]


@pytest.fixture
async def engine(tiny_model_dir: Path) -> AsyncIterator[HFEngine]:
    eng = HFEngine(tiny_model_dir, device="cpu", seed=0)
    await eng.load_weights(tiny_model_dir, 0)
    yield eng
    await eng.close()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_logprobs_equal_an_independent_full_sequence_forward(
    engine: HFEngine, tiny_model_dir: Path, temperature: float
):
    params = SamplingParams(n=8, temperature=temperature, max_new_tokens=12, seed=3)
    completions = await engine.generate(PROMPT, params)
    model = reference_model(tiny_model_dir)
    for c in completions:
        assert (
            np.abs(c.logprobs - full_forward_logprobs(model, PROMPT, c, temperature)).max() < 1e-4
        )


async def test_behaviour_logprobs_equal_the_learners_recomputed_logprobs(tiny_model_dir, tmp_path):
    from consumer.train.trainer import DeviceTrainer

    cfg = C.Config()
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, device="cpu"),
        sampling=dataclasses.replace(cfg.sampling, temperature=0.7),
    )
    trainer = DeviceTrainer(cfg, tiny_model_dir)
    published: list[wire.SnapshotInfo] = []  # the learner's own publication path
    publisher = Publisher(tmp_path, tiny_model_dir, keep_last=1, on_published=published.append)
    publisher.submit(trainer.weights(), version=3, step=3, dtype=torch.float32)
    publisher.close()
    snapshot = Path(published[0].path).parent
    engine = HFEngine(tiny_model_dir, device="cpu", seed=0)
    await engine.load_weights(snapshot, 3)
    params = SamplingParams(n=8, temperature=0.7, max_new_tokens=12, seed=5)
    completions = await engine.generate(PROMPT, params)
    await engine.close()
    group = wire.Group(
        lease_id=0, producer_id="t", prompt_index=0, behavior_version=3,
        prompt_ids=np.array(PROMPT, np.int32),
        completion_ids=np.concatenate([c.token_ids for c in completions]),
        completion_lens=np.array([len(c.token_ids) for c in completions], np.int32),
        behavior_logp=np.concatenate([c.logprobs for c in completions]),
        token_versions=np.zeros(0, np.int32), rewards=np.zeros(len(completions), np.float32),
        finish_reasons=tuple(c.finish_reason for c in completions), temperature=0.7,
    )  # fmt: skip
    for c, learner in zip(completions, trainer.logprobs([group]), strict=True):
        assert np.abs(c.logprobs - learner).max() < 1e-4


async def test_a_fixed_seed_repeats_the_completions_and_no_seed_varies_them(engine: HFEngine):
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=10, seed=11)
    a, b = await engine.generate(PROMPT, params), await engine.generate(PROMPT, params)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        np.testing.assert_array_equal(x.logprobs, y.logprobs)
    unseeded = dataclasses.replace(params, seed=None)
    c, d = await engine.generate(PROMPT, unseeded), await engine.generate(PROMPT, unseeded)
    assert [x.token_ids.tolist() for x in c] != [y.token_ids.tolist() for y in d]


async def test_a_row_ends_at_its_first_stop_token_and_keeps_it(engine: HFEngine):
    stops = set(range(1, 12))
    params = SamplingParams(
        n=32, temperature=1.0, max_new_tokens=8, seed=2, stop_token_ids=tuple(sorted(stops))
    )
    out = await engine.generate(PROMPT, params)
    for c in out:
        ids = c.token_ids.tolist()
        if c.finish_reason == "stop":
            assert ids[-1] in stops
            assert not stops & set(ids[:-1])
        else:
            assert len(ids) == 8
            assert not stops & set(ids)
    assert len({len(c.token_ids) for c in out}) > 2  # rows of one batch end at different steps


async def test_the_models_eos_stops_a_row_without_being_asked(engine: HFEngine):
    out = await engine.generate(PROMPT, SamplingParams(n=64, temperature=3.0, max_new_tokens=40))
    stopped = [c for c in out if c.finish_reason == "stop"]
    assert stopped
    assert all(c.token_ids[-1] == 1 for c in stopped)  # "<eos>" from config / generation_config


async def test_generation_before_any_load_reports_version_minus_one(tiny_model_dir: Path):
    engine = HFEngine(tiny_model_dir, device="cpu")
    out = await engine.generate(PROMPT, SamplingParams(n=2, temperature=1.0, max_new_tokens=3))
    await engine.close()
    assert all((c.versions == -1).all() for c in out)


async def test_after_a_reload_the_logprobs_follow_the_new_weights_not_the_old(
    engine: HFEngine, tiny_model_dir: Path, tmp_path: Path
):
    new_dir = write_snapshot(engine.model.state_dict(), tmp_path / "v1", noise=0.05, seed=1)
    await engine.load_weights(new_dir, 1)
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=12, seed=4)
    completions = await engine.generate(PROMPT, params)
    old, new = reference_model(tiny_model_dir), reference_model(tiny_model_dir, new_dir)
    for c in completions:
        assert (c.versions == 1).all()
        assert np.abs(c.logprobs - full_forward_logprobs(new, PROMPT, c, 1.0)).max() < 1e-4
    gap = [np.abs(c.logprobs - full_forward_logprobs(old, PROMPT, c, 1.0)) for c in completions]
    assert np.concatenate(gap).mean() > 1e-3


async def test_a_generation_in_flight_finishes_on_the_weights_it_started_with(
    engine: HFEngine, tiny_model_dir: Path, tmp_path: Path
):
    new_dir = write_snapshot(engine.model.state_dict(), tmp_path / "v1", noise=0.05, seed=1)
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=48, seed=6)
    async with asyncio.timeout(60):
        running = asyncio.create_task(engine.generate(PROMPT, params))
        await asyncio.sleep(0)  # the generation job is queued on the torch thread first
        await engine.load_weights(new_dir, 1)
        completions = await running
    assert engine.version == 1
    old = reference_model(tiny_model_dir)
    for c in completions:
        assert (c.versions == 0).all()
        assert np.abs(c.logprobs - full_forward_logprobs(old, PROMPT, c, 1.0)).max() < 1e-4


async def test_a_bfloat16_snapshot_is_cast_to_the_engines_dtype(engine: HFEngine, tmp_path: Path):
    state = engine.model.state_dict()
    directory = write_snapshot(state, tmp_path / "bf16", noise=0.01, dtype=torch.bfloat16)
    await engine.load_weights(directory, 1)
    expected = load_file(directory / "model.safetensors")
    for name, tensor in expected.items():
        assert engine.model.state_dict()[name].dtype == torch.float32
        torch.testing.assert_close(engine.model.state_dict()[name], tensor.float(), rtol=0, atol=0)
    model = engine.model
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


@pytest.mark.parametrize("names", [(EMBED,), (HEAD,), (EMBED, HEAD)])
async def test_a_snapshot_may_hold_either_or_both_names_of_a_tied_weight(
    engine: HFEngine, tmp_path: Path, names: tuple[str, ...]
):
    state = {k: v.clone() for k, v in engine.model.state_dict().items() if k not in (EMBED, HEAD)}
    embedding = engine.model.model.embed_tokens.weight.detach() + 0.5
    state |= {name: embedding.clone() for name in names}  # clones: safetensors refuses sharing
    directory = tmp_path / "tied"
    directory.mkdir()
    save_file(state, directory / "model.safetensors")
    await engine.load_weights(directory, 2)
    assert engine.version == 2
    assert torch.equal(engine.model.lm_head.weight, embedding)
    assert torch.equal(engine.model.model.embed_tokens.weight, embedding)


def _wrong_shape(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**state, "model.norm.weight": torch.zeros(3)}


def _missing(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if k != "model.layers.1.mlp.up_proj.weight"}


def _unexpected(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**state, "model.layers.9.mlp.up_proj.weight": torch.zeros(2, 2)}


def _tied_disagree(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**state, HEAD: state[EMBED] + 1.0}


@pytest.mark.parametrize(
    ("corrupt", "match"),
    [(_wrong_shape, "wrong shape: model.norm.weight"), (_missing, "missing: model.layers.1"),
     (_unexpected, "unexpected: model.layers.9"), (_tied_disagree, "tied .* differ"),
     ("garbage", "cannot read"),
     ("absent", "cannot read")],
)  # fmt: skip
async def test_a_snapshot_that_does_not_fit_is_refused_and_the_old_weights_stay(
    engine: HFEngine, tmp_path: Path, corrupt, match: str
):
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    bad = tmp_path / "bad"
    bad.mkdir()
    if corrupt == "garbage":
        (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    elif callable(corrupt):
        noisy = write_snapshot(before, tmp_path / "noisy", noise=0.1)
        save_file(corrupt(load_file(noisy / "model.safetensors")), bad / "model.safetensors")
    with pytest.raises(SnapshotError, match=match):
        await engine.load_weights(bad, 1)
    assert engine.version == 0
    after = engine.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
