"""Which settings a replay may change: the learner's, never those that decided the data
(consumer/stream/rules.py)."""

from __future__ import annotations

import pytest

from common import config as C
from common.errors import ConfigError
from consumer.stream import rules

BASE = C.Config()


@pytest.mark.parametrize(
    "key",
    ["loss.tis_cap", "loss.tis_mode", "loss.agg", "loss.beta", "train.lr", "train.grad_clip"],
)
def test_learner_settings_may_change(key: str) -> None:
    value = {"loss.tis_mode": "mask", "loss.agg": "seq-mean-token-mean"}.get(key, 0.5)
    assert rules.check(BASE, C.override(BASE, {key: value})) == [key]


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("sampling.temperature", 0.7, "sampled with it"),
        ("sampling.group_size", 4, "sampled with it"),
        ("staleness.max_staleness", 0, "trained or dropped"),
        ("train.prompts_per_step", 4, "that many groups"),
        ("task.shuffle", False, "prompts came from it"),
        ("run.seed", 3, "that seed set"),
    ],
)
def test_settings_that_decided_the_data_are_refused_with_why(key, value, why) -> None:
    with pytest.raises(ConfigError, match=rf"{key} cannot change \(.*{why}"):
        rules.check(BASE, C.override(BASE, {key: value}))


def test_the_pass_settings_decide_whether_recorded_pass_counts_apply() -> None:
    assert rules.same_passes(BASE, C.override(BASE, {"loss.tis_cap": 3.0}))
    assert not rules.same_passes(BASE, C.override(BASE, {"train.micro_batch_tokens": 64}))
