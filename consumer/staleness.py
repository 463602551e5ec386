"""The staleness gate: which arriving groups may be trained at the learner's current version.

`lag = policy_version - behavior_version`, where `behavior_version` is the oldest weight version
that produced any token of the group (per-token versions when weights changed mid-generation).
A group is trained at version v only if `0 <= lag <= max_staleness`; otherwise it is dropped
and counted (`dropped_stale`). A negative lag happens only after a resume from an older
checkpoint: those weights were never part of this run's history. Leases already keep the bound
by construction (consumer/server/leases.py); this gate is what makes it a guarantee even when groups
overtake each other in flight.

A group whose rewards are all equal has zero advantage for every completion, so it carries no
policy-gradient signal; with `drop_zero_variance` it is dropped (`dropped_zero_variance`) and the
batch is filled with other groups (dynamic sampling). Of a group of episodes only those its
environment did not fail count (`env_error` episodes are never trained): fewer than two of them
is no signal either.
"""

from __future__ import annotations

import numpy as np

from common.wire import Group

ENV_ERROR = "env_error"  # an episode its environment failed (never trained)


def lag(policy_version: int, group: Group) -> int:
    return policy_version - group.behavior_version


def verdict(
    group: Group, *, policy_version: int, max_staleness: int, drop_zero_variance: bool
) -> str | None:
    """None to train the group now, else the ledger outcome that drops it."""
    behind = lag(policy_version, group)
    if behind > max_staleness or behind < 0:  # < 0: weights of a lineage a resume abandoned
        return "dropped_stale"
    if drop_zero_variance and no_signal(group):
        return "dropped_zero_variance"
    return None


def no_signal(group: Group) -> bool:
    """Whether the group's trainable completions all have the same reward (or are fewer than
    two): every advantage is 0."""
    if ENV_ERROR not in group.finish_reasons:
        return zero_variance(group.rewards)
    valid = np.array([r != ENV_ERROR for r in group.finish_reasons])
    return int(valid.sum()) < 2 or zero_variance(group.rewards[valid])


def zero_variance(rewards: np.ndarray) -> bool:
    return bool(np.all(rewards == rewards[0]))
