"""Truncated sampling (top-k, top-p, min-p) from the hf engine to the loss, float32, tiny model.

The engine samples inside the kept set the rule of common/sampling/kept_set.py gives on the logits
of an independent full-sequence forward, and reports log q over it; the group carries the sets over
the wire; at the same weights (max_staleness 0) the learner's log π_K over the recorded set equals
log q to 1e-5 per token, while the full-vocabulary log-prob of the same tokens falls short by log S
(the kept mass): the bias that carrying the set removes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import reference_model

from common import config as C
from common import wire
from common.sampling import kept_set
from common.sampling.kept_set import Truncation, reference_kept_set, reference_log_q
from consumer.train.trainer import DeviceTrainer
from producer.engines.base import Completion, SamplingParams
from producer.engines.hf import HFEngine

PROMPT = [3, 4, 12, 5, 15]
TEMPERATURE = 0.7
TRUNCATIONS = {
    "top_p_0.9": Truncation(top_p=0.9),
    "top_k_8": Truncation(top_k=8),
    "all_three": Truncation(top_k=12, top_p=0.8, min_p=0.05),
    "min_p_under_max_kept": Truncation(min_p=0.02, max_kept=6),
}


async def _sample(model_dir: Path, truncation: Truncation, *, n: int = 8) -> list[Completion]:
    engine = HFEngine(model_dir, device="cpu", seed=0)
    try:
        await engine.load_weights(model_dir, 0)
        params = SamplingParams(
            n=n, temperature=TEMPERATURE, max_new_tokens=12, seed=3, truncation=truncation
        )
        return await engine.generate(PROMPT, params)
    finally:
        await engine.close()


def _sets(c: Completion) -> list[np.ndarray]:
    """Each token's kept set, the token included (ascending)."""
    k = c.kept
    return [
        np.sort(np.append(k.ids[k.offsets[t] : k.offsets[t + 1]], c.token_ids[t]))
        for t in range(len(c.token_ids))
    ]


@pytest.mark.parametrize("name", sorted(TRUNCATIONS))
async def test_the_engine_samples_inside_the_rules_kept_set_and_reports_log_q(
    tiny_model_dir: Path, name: str
):
    truncation = TRUNCATIONS[name]
    completions = await _sample(tiny_model_dir, truncation)
    model = reference_model(tiny_model_dir)
    full_logp, sizes = [], []
    for c in completions:
        assert c.kept.present
        assert len(c.kept.unknown) == 0  # our own sampler always knows its kept set
        ids = torch.tensor([PROMPT + c.token_ids.tolist()])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(PROMPT) - 1 : -1].float().numpy()
        for t, kept in enumerate(_sets(c)):
            token = int(c.token_ids[t])
            assert token in kept
            assert len(kept) <= truncation.max_kept
            want = reference_kept_set(logits[t], truncation, temperature=TEMPERATURE)
            np.testing.assert_array_equal(kept, want)
            log_q = reference_log_q(logits[t], kept, token, temperature=TEMPERATURE)
            assert abs(float(c.logprobs[t]) - log_q) < 1e-5
            z = logits[t].astype(np.float64) / TEMPERATURE
            full_logp.append(z[token] - np.log(np.exp(z - z.max()).sum()) - z.max())
            sizes.append(len(kept))
    # truncation bites: sets are smaller than the vocabulary, q > p for the sampled tokens
    assert np.mean(sizes) < model.config.vocab_size
    behaviour = np.concatenate([c.logprobs for c in completions])
    assert (behaviour - np.array(full_logp) > 1e-3).mean() > 0.5


def _group(completions: list[Completion]) -> wire.Group:
    lens = [len(c.token_ids) for c in completions]
    kept = kept_set.concat([c.kept for c in completions], lens)
    return wire.Group(
        lease_id=0, producer_id="t", prompt_index=0, behavior_version=0,
        prompt_ids=np.array(PROMPT, np.int32),
        completion_ids=np.concatenate([c.token_ids for c in completions]),
        completion_lens=np.array(lens, np.int32),
        behavior_logp=np.concatenate([c.logprobs for c in completions]),
        token_versions=np.zeros(0, np.int32), rewards=np.arange(len(lens), dtype=np.float32),
        finish_reasons=tuple(c.finish_reason for c in completions), temperature=TEMPERATURE,
        kept_counts=kept.other_counts(), kept_ids=kept.ids, kept_unknown=kept.unknown,
    )  # fmt: skip


def _config(truncation: Truncation) -> C.Config:
    return C.override(
        C.Config(),
        {
            "model.device": "cpu",
            "sampling.temperature": TEMPERATURE,
            "sampling.top_k": truncation.top_k,
            "sampling.top_p": truncation.top_p,
            "sampling.min_p": truncation.min_p,
            "sampling.max_kept": truncation.max_kept,
        },
    )


@pytest.mark.parametrize("name", ["top_p_0.9", "top_k_8"])
async def test_the_learners_kept_set_log_prob_is_the_behaviour_log_q_and_the_full_one_is_not(
    tiny_model_dir: Path, name: str
):
    truncation = TRUNCATIONS[name]
    cfg = _config(truncation)
    group = _group(await _sample(tiny_model_dir, truncation))
    limits = wire.Limits(
        vocab_size=64, group_size=8, temperature=TEMPERATURE, max_kept=truncation.max_kept
    )
    group = wire.decode(wire.encode(group), limits)  # what the learner receives
    trainer = DeviceTrainer(cfg, tiny_model_dir)  # the weights that sampled: max_staleness 0

    learner = np.concatenate(trainer.logprobs([group]))
    behaviour = group.behavior_logp
    assert np.abs(learner - behaviour).max() < 1e-5  # per token
    ratio_kept = np.exp(learner.astype(np.float64) - behaviour)
    assert abs(ratio_kept.mean() - 1) < 1e-5

    untruncated = dataclasses.replace(
        group, kept_counts=np.zeros(0, np.uint8), kept_ids=np.zeros(0, np.int32)
    )
    naive = np.concatenate(trainer.logprobs([untruncated]))  # full-vocabulary log-softmax
    ratio_full = np.exp(naive.astype(np.float64) - behaviour)  # = S, the kept mass
    assert ratio_full.mean() < 0.99
    assert (ratio_full <= 1 + 1e-5).all()


async def test_a_training_step_reports_the_kept_mass_sizes_and_the_ratio_band(tiny_model_dir):
    truncation = TRUNCATIONS["top_k_8"]
    cfg = _config(truncation)
    group = _group(await _sample(tiny_model_dir, truncation))
    m = DeviceTrainer(cfg, tiny_model_dir).step([group])
    assert 0 < m["kept_mass_mean"] < 0.99
    assert m["kept_size_mean"] == pytest.approx(8.0)  # the rule keeps exactly 8 without ties
    assert m["ratio_out_of_band"] == 0.0  # at the weights that sampled, with the kept sets
    assert m["tokens_kept_unknown"] == 0
    assert m["num_tokens"] == group.num_tokens

    untruncated = dataclasses.replace(
        group, kept_counts=np.zeros(0, np.uint8), kept_ids=np.zeros(0, np.int32)
    )
    naive = DeviceTrainer(C.override(cfg, {"sampling.top_k": 0}), tiny_model_dir)
    m = naive.step([untruncated])  # the same tokens, trained as if untruncated: biased ratios
    assert m["ratio_out_of_band"] > 0.5
    assert m["kept_mass_mean"] == 1.0
    assert m["kept_size_mean"] == naive.vocab_size


async def test_tokens_whose_kept_set_is_unknown_are_counted_and_not_trained(tiny_model_dir):
    truncation = TRUNCATIONS["top_k_8"]
    cfg = _config(truncation)
    completions = await _sample(tiny_model_dir, truncation, n=4)
    i = int(np.argmax([len(c.token_ids) for c in completions]))
    c = completions[i]
    assert len(c.token_ids) >= 2
    k = c.kept
    others = [k.ids[k.offsets[t] : k.offsets[t + 1]] for t in range(len(c.token_ids))]
    others[1] = np.zeros(0, np.int32)  # as the vllm engine records a token it cannot vouch for
    logp = c.logprobs.copy()
    logp[1] = 0.0
    kept = kept_set.from_lists(others, unknown=[1])
    completions[i] = dataclasses.replace(c, kept=kept, logprobs=logp)
    group = _group(completions)
    m = DeviceTrainer(cfg, tiny_model_dir).step([group])
    assert m["tokens_kept_unknown"] == 1
    assert m["num_tokens"] == group.num_tokens - 1
    assert m["ratio_out_of_band"] == 0.0  # the unknown token's 0.0 "log q" is never compared
