"""The staleness gate: which arriving groups are trained at the learner's version."""

from __future__ import annotations

import numpy as np
import pytest

from common import wire
from consumer.staleness import lag, verdict, zero_variance


def make_group(behavior_version: int, rewards: list[float], token_versions=()) -> wire.Group:
    g = len(rewards)
    n = len(token_versions) or g
    return wire.Group(
        lease_id=0, producer_id="p", prompt_index=0, behavior_version=behavior_version,
        prompt_ids=np.array([1], np.int32), completion_ids=np.ones(n, np.int32),
        completion_lens=np.array([n // g] * (g - 1) + [n - (n // g) * (g - 1)], np.int32),
        behavior_logp=np.full(n, -1.0, np.float32),
        token_versions=np.array(token_versions, np.int32),
        rewards=np.array(rewards, np.float32), finish_reasons=("stop",) * g, temperature=1.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "behavior", "max_staleness", "rewards", "drop_zero_variance", "expected"),
    [
        (0, 0, 0, [1, 0], True, None),  # on-policy
        (5, 5, 0, [1, 0], True, None),
        (5, 4, 0, [1, 0], True, "dropped_stale"),  # synchronous: any lag is too much
        (5, 3, 2, [1, 0], True, None),  # lag == max_staleness is trained
        (5, 2, 2, [1, 0], True, "dropped_stale"),
        (9, 0, 8, [0.5, 0.25], False, "dropped_stale"),
        (5, 5, 2, [1, 1], True, "dropped_zero_variance"),
        (5, 5, 2, [0, 0, 0, 0], True, "dropped_zero_variance"),
        (5, 5, 2, [1, 1], False, None),  # kept when not asked to drop
        (5, 1, 2, [1, 1], True, "dropped_stale"),  # stale wins: the prompt is retried
        (5, 5, 2, [1, 1, 1, 0.999], True, None),
    ],
)  # fmt: skip
def test_verdicts(policy, behavior, max_staleness, rewards, drop_zero_variance, expected):
    g = make_group(behavior, rewards)
    got = verdict(
        g,
        policy_version=policy,
        max_staleness=max_staleness,
        drop_zero_variance=drop_zero_variance,
    )
    assert got == expected
    assert lag(policy, g) == policy - behavior


def test_a_group_sampled_across_a_weight_reload_is_as_old_as_its_oldest_token():
    # The producer reports behavior_version = min(token_versions); the gate trusts that.
    g = make_group(1, [1, 0], token_versions=[1, 1, 3, 3])
    assert lag(3, g) == 2
    assert verdict(g, policy_version=3, max_staleness=1, drop_zero_variance=True) == (
        "dropped_stale"
    )
    assert verdict(g, policy_version=3, max_staleness=2, drop_zero_variance=True) is None


@pytest.mark.parametrize(
    ("rewards", "expected"),
    [([1.0, 1.0], True), ([0.0], True), ([0.0, 0.0, 1.0], False), ([-0.0, 0.0], True),
     ([0.5, 0.5, 0.5 + 1e-7], False)],
)  # fmt: skip
def test_zero_variance(rewards, expected):
    assert zero_variance(np.array(rewards, np.float32)) is expected


def test_every_verdict_is_a_ledger_outcome():
    for behavior, rewards in [(0, [1, 1]), (9, [1, 0]), (9, [1, 1])]:
        got = verdict(
            make_group(behavior, rewards), policy_version=9, max_staleness=2,
            drop_zero_variance=True,
        )  # fmt: skip
        assert got is None or got in wire.OUTCOMES
