"""What the rewards of one step say: the tally of every group that arrived for it.

A pure accumulator, fed by the learner's collection loop (consumer/learner.py) one group at a
time, kept or dropped, and read once when the step ends (`fields`). The headline numbers a user
watches come from here, so they are honest about what the policy sampled:

- `reward_mean_seen`: mean reward over every completion of every group that arrived for the
  step (dropped ones included: zero variance, stale). This is the policy's sampled reward.
  `reward_mean` (over the trained groups only) is the learner's batch, which excludes the
  groups whose completions were all right (or all wrong) once `train.drop_zero_variance` is on:
  it stays near the middle while the policy improves, so it is reported beside, never alone.
- `frac_reward_zero_std`: the share of arrived groups whose G rewards were all equal (no
  learning signal); beside the reward wherever it is shown.
- `reward_fn_means`: {reward function: mean unweighted score} over every completion of the
  arrived groups that carried per-function scores (`wire.Group.reward_parts`; the names are
  common/config/run.py `reward_names`, in `rewards.fns` order). None when no group carried any
  (the fake engine's coins).
- the episodes' own numbers in a multi-turn run (consumer/episode_tally.py): turns, tokens,
  the share the model sampled, environment time and errors.

Invariants: every number is a mean over completions (not over groups); a group counts once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common import wire
from consumer.episode_tally import EpisodeTally
from consumer.staleness import no_signal


@dataclass
class RewardTally:
    """The rewards of the groups that arrived for one step (see the module docstring)."""

    names: list[str]  # reward function names, in `rewards.fns` order
    seen: int = 0  # groups
    zero_std: int = 0  # groups whose rewards were all equal
    reward_sum: float = 0.0
    completions: int = 0
    fn_sums: np.ndarray = field(init=False)  # float64 [F]
    fn_completions: int = 0  # completions of the groups that carried per-function scores
    episodes: EpisodeTally = field(default_factory=EpisodeTally)  # multi-turn runs' episodes

    def __post_init__(self) -> None:
        self.fn_sums = np.zeros(len(self.names), np.float64)

    def add(self, g: wire.Group) -> None:
        """Count one arrived group (before its verdict)."""
        self.seen += 1
        self.zero_std += no_signal(g)
        self.episodes.add(g)
        self.reward_sum += float(g.rewards.sum(dtype=np.float64))
        self.completions += g.group_size
        parts = g.reward_parts_FG()
        if len(parts) == len(self.names) and len(parts):
            self.fn_sums += parts.sum(axis=1, dtype=np.float64)
            self.fn_completions += g.group_size

    def fields(self) -> dict[str, Any]:
        """The step's `StepRecord` fields this tally owns (common/files/metrics.py)."""
        fn_means = None
        if self.fn_completions:
            means = self.fn_sums / self.fn_completions
            fn_means = {n: float(m) for n, m in zip(self.names, means, strict=True)}
        return {
            "reward_mean_seen": self.reward_sum / max(self.completions, 1),
            "frac_reward_zero_std": self.zero_std / max(self.seen, 1),
            "reward_fn_means": fn_means,
            **self.episodes.fields(),
        }
