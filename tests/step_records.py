"""A whole `common.files.metrics.StepRecord` line for tests of what reads metrics (the headline
numbers, the trackers): every required field, plausible values; tests override what they check."""

from __future__ import annotations

from typing import Any

BASE: dict[str, Any] = {
    "step": 1, "time_s": 1.5, "unix_time": 1.7e9, "step_wall_s": 0.5, "reward_mean": 0.5,
    "reward_std": 0.5, "frac_reward_zero_std": 0.5, "staleness_mean": 0.0, "staleness_max": 0,
    "staleness_hist": {"0": 2}, "tokens_per_s": 100.0, "learner_idle_frac": 0.2, "wait_s": 0.1,
    "publish_submit_s": 0.01, "snapshot_write_s": 0.02, "num_completion_tokens": 50,
    "groups_trained": 2, "groups_dropped_stale": 0, "groups_dropped_zero_variance": 2,
    "groups_rejected_invalid": 0, "groups_expired": 0, "leases_open": 0, "rejected_messages": 0,
}  # fmt: skip
