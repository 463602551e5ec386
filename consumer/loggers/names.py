"""Where each metric of metrics.jsonl goes in an experiment tracker: a namespaced name.

`namespaced(record)` maps one `StepRecord` (common/files/metrics.py) to flat `{name: number}`:
`reward/` (the rewards, the share of equal-reward groups, `reward/fn/<function>`),
`rollout/` (the ledger's counts, leases, producers, a multi-turn run's episodes: turns, tokens,
the sampled share, environment time and errors, `rollout/episode_ends/<reason>`),
`staleness/` (mean, max, `staleness/hist/<lag>`), `throughput/` (wall times, tokens/s, idle,
backpressure),
`weights/` (snapshot publication), `eval/` (evaluations), and `train/` (the optimizer step:
every trainer metric, and any field not named here, so a new metric is never lost). Dict fields
are flattened one level (`rollout/producers_by_state/<state>`). Left out: `step` (it is the
tracker's step: the policy version), `unix_time`, strings (`attention`) and the per-producer
maps of old runs. Booleans and None are left out; numbers become floats.

`by_step(record)`: the same names by the tracker step each belongs to. A round of evaluation
during training completes some steps after the version it evaluated; its result (`EVAL_RESULT`)
goes at that version (`eval_version`), so a chart of `eval/eval_pass_at_1` has its points where
reward.png and summary.md put them; everything else (the eval ledger's counts included) goes at
the record's own step.
"""

from __future__ import annotations

from typing import Any

from common.files.metrics import StepRecord
from consumer.episode_tally import FIELDS as EPISODE_FIELDS

NAMESPACES = ("train", "rollout", "reward", "staleness", "throughput", "weights", "eval")
_PREFIX: dict[str, str] = {
    **dict.fromkeys(
        ("reward_mean", "reward_std", "reward_mean_seen", "frac_reward_zero_std"), "reward"
    ),
    "reward_fn_means": "reward/fn",
    **dict.fromkeys(("staleness_mean", "staleness_max"), "staleness"),
    "staleness_hist": "staleness/hist",
    **dict.fromkeys(
        (
            "groups_trained",
            "groups_dropped_stale",
            "groups_dropped_zero_variance",
            "groups_rejected_invalid",
            "groups_expired",
            "leases_open",
            "rejected_messages",
            "producers_live",
            "producers_by_state",
            *EPISODE_FIELDS,
        ),
        "rollout",
    ),
    **dict.fromkeys(
        (
            "time_s",
            "step_wall_s",
            "tokens_per_s",
            "learner_idle_frac",
            "wait_s",
            "round_trip_s",
            "num_completion_tokens",
            "queued_groups",
            "queued_bytes",
            "queued_groups_peak",
            "queued_bytes_peak",
            "groups_held",
            "holds",
            "hold_s_mean",
            "hold_s_max",
            "loggers_dropped",
            "loggers_failed",
        ),
        "throughput",
    ),
    **dict.fromkeys(("publish_submit_s", "snapshot_write_s", "snapshots_superseded"), "weights"),
    **dict.fromkeys(("heldout_accuracy", "eval_s"), "eval"),
}
_SKIP = frozenset(("step", "unix_time", "producers", "producer_counters", "world_size"))
EVAL_RESULT = frozenset(
    (
        "eval_version",
        "eval_reward_mean",
        "eval_pass_at_1",
        "eval_pass_at_k",
        "eval_k",
        "eval_completion_len_mean",
        "eval_prompts",
    )
)  # one evaluated version's result (consumer/evaluation/rounds.py `take_results`)


def by_step(record: StepRecord) -> list[tuple[int, dict[str, float]]]:
    """`(step, values)` for the trackers: the record's step, then the version a round it
    carries evaluated (see the module docstring)."""
    values = namespaced(record)
    if record.eval_version is None:
        return [(record.step, values)]
    result = {f"eval/{k}": values.pop(f"eval/{k}") for k in EVAL_RESULT if f"eval/{k}" in values}
    return [(record.step, values), (record.eval_version, result)]


def namespaced(record: StepRecord) -> dict[str, float]:
    """The record's numbers under their tracker names (see the module docstring)."""
    out: dict[str, float] = {}
    for key, value in record.to_json().items():
        if key in _SKIP:
            continue
        prefix = _PREFIX.get(key, "eval" if key.startswith("eval_") else "train")
        if isinstance(value, dict):
            sub = prefix if "/" in prefix else f"{prefix}/{key}"
            for name, item in value.items():
                _put(out, f"{sub}/{name}", item)
        else:
            _put(out, f"{prefix}/{key}" if "/" not in prefix else prefix, value)
    return out


def _put(out: dict[str, float], name: str, value: Any) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        out[name] = float(value)
