"""The stress sweep's numbers: one row per setting from its run's files, and what compares rows.

`measure(run_dir, steps=...)` reads `metrics.jsonl`, `leases.jsonl` and `ledger.json`. Rates
and the staleness histogram cover the first `steps` steps (an equal-time run goes on beyond them);
the ledger's counts cover the whole run. Definitions (times on the learner's clock, `time_s`,
which starts when every producer holds the first snapshot):
- `wall_s`: time to step `steps`; `steps_per_hour = 3600 * steps / wall_s`; `run_wall_s`: the
  whole run. `speedup_vs_sync` divides steps/hour by that of the `max_staleness = 0` row of the
  same producers, IS mode and seed (`add_speedups`).
- `learner_idle_frac = Σ wait_s / wall_s`; `producer_idle_frac = 1 - Σ busy_s / Σ uptime_s`.
- `ess`: mean per-step effective sample size of the TIS token weights, `(Σw)² / (n Σw²)`.
- rewards are smoothed over the last `WINDOW` steps (the mean of their `reward_mean`):
  `final_reward` at step `steps`; `reward_at_equal_time` at the last step within `t_sync_s`, the
  synchronous setting's `wall_s` (for the synchronous setting itself, at its end);
  `time_to_target_s` / `steps_to_target`: the first step at which it reaches `target_reward`
  (over the whole run; empty = never).
- held-out scores (launch/stress/setting.py): `final_accuracy` of snapshot `final_version`
  (version `steps`, or the newest written before it when a newer one superseded its write) and
  `accuracy_at_equal_time` of `equal_time_version` (the newest by `t_sync_s`).
- `hosts`: {host: [producer ids]} of the producers that held leases (the ledger's record).
- `load_mean`: the machine's mean 1-minute load average during the setting, `cores` the cores
  it could use (launch/stress/setting.py); summary.md's verdict (launch/stress/verdict.py)
  weighs the timings by them.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from common.files import run_files as RF
from common.files.metrics import StepRecord, read_steps

WINDOW = 10  # steps over which rewards are averaged
COLUMNS = [
    "setting",
    "status",
    "error",
    "max_staleness",
    "producers",
    "is_mode",
    "variant",
    "seed",
    "engine",
    "placement",
    "hosts",
    "load_mean",
    "cores",
    "steps",
    "wall_s",
    "run_wall_s",
    "steps_per_hour",
    "speedup_vs_sync",
    "groups_per_s",
    "tokens_per_s",
    "learner_idle_frac",
    "producer_idle_frac",
    "trained",
    "dropped_stale",
    "dropped_zero_variance",
    "expired",
    "staleness_mean_trained",
    "staleness_max_trained",
    "staleness_hist",
    "tis_weight_mean",
    "tis_frac_truncated",
    "ess",
    "trained_mean_tokens",
    "dropped_stale_mean_tokens",
    "expired_by_producer",
    "dropped_stale_by_producer",
    "final_reward",
    "equal_time_s",
    "reward_at_equal_time",
    "target_reward",
    "time_to_target_s",
    "steps_to_target",
    "heldout",
    "final_accuracy",
    "final_version",
    "accuracy_at_equal_time",
    "equal_time_version",
]
# Compared across seeds in summary.md and the plots (mean and range).
AGGREGATED = [
    "steps_per_hour",
    "speedup_vs_sync",
    "learner_idle_frac",
    "producer_idle_frac",
    "dropped_stale",
    "tis_weight_mean",
    "ess",
    "final_reward",
    "reward_at_equal_time",
    "time_to_target_s",
    "final_accuracy",
    "accuracy_at_equal_time",
    "load_mean",
]


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _measured(xs: Iterable[float | None]) -> float | None:
    return _mean([x for x in xs if x is not None])


def smoothed_rewards(metrics: list[StepRecord], start: float) -> list[tuple[float, int, float]]:
    """(time since start, step, mean reward of the last WINDOW steps) per step."""
    out = []
    for i, m in enumerate(metrics):
        window = metrics[max(0, i - WINDOW + 1) : i + 1]
        out.append((m.time_s - start, m.step, statistics.fmean(r.reward_mean for r in window)))
    return out


def reward_at(curve: list[tuple[float, int, float]], t_s: float) -> float | None:
    """The smoothed reward of the last step that ended by `t_s` (None: none had)."""
    before = [r for t, _, r in curve if t <= t_s + 1e-9]
    return before[-1] if before else None


def first_reaching(
    curve: list[tuple[float, int, float]], target: float | None
) -> tuple[float, int] | None:
    """(time, step) of the first step whose smoothed reward is >= `target` (None: never)."""
    if target is None:
        return None
    return next(((t, s) for t, s, r in curve if r >= target), None)


def measure(
    run_dir: Path,
    *,
    steps: int,
    t_sync_s: float | None = None,
    target_reward: float | None = None,
) -> dict[str, Any]:
    """One results row from a finished run's files (see the module docstring); `t_sync_s` None
    means this is the synchronous setting (its own end is the equal-time point)."""
    everything = read_steps(run_dir / RF.METRICS)
    metrics = everything[:steps]
    leases = RF.read_leases(run_dir)
    ledger = RF.read_ledger(run_dir)
    bal = ledger.balance
    start = metrics[0].time_s - metrics[0].step_wall_s if metrics else 0.0
    wall = metrics[-1].time_s - start if metrics else 0.0
    trained = [r for r in leases if r.state == "trained" and r.trained_step < steps]
    stale = [r for r in leases if r.state == "dropped_stale"]
    lags = [r.staleness for r in trained]
    views = RF.latest_producers(run_dir, metrics[-1] if metrics else None).values()
    busy, uptime = sum(v.busy_s for v in views), sum(v.uptime_s for v in views)
    curve = smoothed_rewards(everything, start)
    t_equal = wall if t_sync_s is None else t_sync_s
    at_equal, reached = reward_at(curve, t_equal), first_reaching(curve, target_reward)
    hosts: dict[str, list[str]] = {}
    for producer, host in sorted(ledger.hosts.items()):
        hosts.setdefault(host or "?", []).append(producer)

    def by_producer(state: str) -> str:
        return json.dumps({p: ledger.count(p, state) for p in sorted(ledger.by_producer)})

    rate = (lambda x: x / wall) if wall > 0 else (lambda x: None)
    return {
        "steps": len(metrics),
        "wall_s": wall,
        "run_wall_s": everything[-1].time_s - start if everything else 0.0,
        "steps_per_hour": rate(3600 * len(metrics)),
        "groups_per_s": rate(len(trained)),
        "tokens_per_s": rate(sum(m.num_completion_tokens for m in metrics)),
        "learner_idle_frac": rate(sum(m.wait_s for m in metrics)),
        "producer_idle_frac": 1 - busy / uptime if uptime > 0 else None,
        "trained": bal.trained,
        "dropped_stale": bal.dropped_stale,
        "dropped_zero_variance": bal.dropped_zero_variance,
        "expired": bal.expired,
        "staleness_mean_trained": _mean(lags),
        "staleness_max_trained": max(lags) if lags else None,
        "staleness_hist": json.dumps({k: lags.count(k) for k in sorted(set(lags))}),
        "tis_weight_mean": _measured(m.tis_weight_mean for m in metrics),
        "tis_frac_truncated": _measured(m.tis_frac_truncated for m in metrics),
        "ess": _measured(m.tis_ess for m in metrics),
        "trained_mean_tokens": _mean([r.num_tokens for r in trained]),
        "dropped_stale_mean_tokens": _mean([r.num_tokens for r in stale]),
        "expired_by_producer": by_producer("expired"),
        "dropped_stale_by_producer": by_producer("dropped_stale"),
        "hosts": json.dumps(hosts),
        "final_reward": curve[len(metrics) - 1][2] if metrics else None,
        "equal_time_s": t_equal,
        "reward_at_equal_time": at_equal,
        "target_reward": target_reward,
        "time_to_target_s": reached[0] if reached else None,
        "steps_to_target": reached[1] if reached else None,
        "_curve": [(t, r) for t, _, r in curve],  # for the plots; not a column
        "_accuracy_curve": [
            (m.time_s - start, m.heldout_accuracy)
            for m in everything
            if m.heldout_accuracy is not None
        ],
    }


def is_sync_of(sync: dict[str, Any], row: dict[str, Any]) -> bool:
    """`sync` is the synchronous setting `row` is compared with."""
    same = ("producers", "is_mode", "seed")
    return (
        sync.get("max_staleness") == 0
        and all(sync.get(k) == row.get(k) for k in same)
        and variant_of(sync) == variant_of(row)
    )


def variant_of(row: dict[str, Any]) -> str:
    """The row's loss variant (launch/stress/plan.py VARIANTS; "config" in older sweeps)."""
    return str(row.get("variant") or "config")


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """speedup_vs_sync of every row against its synchronous setting (`is_sync_of`)."""
    for row in rows:
        sync = next((r for r in rows if is_sync_of(r, row) and r.get("steps_per_hour")), None)
        if sync and row.get("steps_per_hour"):
            row["speedup_vs_sync"] = row["steps_per_hour"] / sync["steps_per_hour"]
        else:
            row["speedup_vs_sync"] = None


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Finished rows grouped over seeds: per (variant, max_staleness, producers, is_mode), each
    AGGREGATED key as `key` (mean), `key_min`, `key_max`, and `seeds` (how many)."""
    groups: dict[tuple[str, int, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("status") == "ok":
            group = (variant_of(r), r["max_staleness"], r["producers"], r["is_mode"])
            groups.setdefault(group, []).append(r)
    out = []
    for (variant, ms, n, mode), members in sorted(groups.items()):
        agg: dict[str, Any] = {"max_staleness": ms, "producers": n, "is_mode": mode}
        agg["variant"] = variant
        agg["seeds"] = len(members)
        for key in AGGREGATED:
            values = [r[key] for r in members if r.get(key) is not None]
            agg[key] = _mean(values)
            agg[f"{key}_min"] = min(values) if values else None
            agg[f"{key}_max"] = max(values) if values else None
        out.append(agg)
    return out


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: cell(row.get(k)) for k in COLUMNS})


def cell(v: Any) -> Any:
    return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else v)


def _spread(agg: dict[str, Any], key: str, fmt: str = ".3g", scale: float = 1.0) -> str:
    mean, low, high = agg.get(key), agg.get(f"{key}_min"), agg.get(f"{key}_max")
    if mean is None:
        return "–"
    text = format(mean * scale, fmt)
    if agg["seeds"] > 1 and low is not None and high is not None and low != high:
        text += f" ({format(low * scale, fmt)}–{format(high * scale, fmt)})"
    return text


def summary(rows: list[dict[str, Any]], plots: list[Path], notes: list[str]) -> str:
    """summary.md: the verdict (launch/stress/verdict.py), the settings over seeds (mean,
    range), failures, notes, plots."""
    from launch.stress.verdict import verdict

    head = [
        "loss",
        "max_staleness",
        "producers",
        "IS",
        "seeds",
        "steps/hour",
        "speedup vs sync",
        "learner idle (%)",
        "dropped stale",
        "reward (equal steps)",
        "reward at sync wall-clock",
        "time to target (s)",
        "held-out (equal steps, %)",
        "held-out at sync wall-clock (%)",
    ]
    lines = ["# Staleness sweep", "", *notes, ""] if notes else ["# Staleness sweep", ""]
    lines += verdict(aggregate(rows), [r for r in rows if r.get("status") == "ok"])
    lines += ["## Settings", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in aggregate(rows):
        cells = [
            a["variant"],
            str(a["max_staleness"]),
            str(a["producers"]),
            a["is_mode"],
            str(a["seeds"]),
            _spread(a, "steps_per_hour", ".0f"),
            _spread(a, "speedup_vs_sync", ".2f"),
            _spread(a, "learner_idle_frac", ".0f", 100),
            _spread(a, "dropped_stale", ".0f"),
            _spread(a, "final_reward"),
            _spread(a, "reward_at_equal_time"),
            _spread(a, "time_to_target_s", ".0f"),
            _spread(a, "final_accuracy", ".1f", 100),
            _spread(a, "accuracy_at_equal_time", ".1f", 100),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    failed = [r for r in rows if r.get("status") != "ok"]
    if failed:
        lines += ["", "## Failed settings", ""]
        lines += [f"- `{r['setting']}`: {r.get('error', '')}" for r in failed]
    knee = [a for a in aggregate(rows) if (a.get("learner_idle_frac") or 1) < 0.1]
    if knee:
        first = min(knee, key=lambda a: a["max_staleness"])
        lines += [
            "",
            "The learner stops waiting (idle < 10%) from max_staleness = "
            f"{first['max_staleness']}: beyond it, producers are not the bottleneck.",
        ]
    lines += ["", "## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots]
    return "\n".join(lines) + "\n"


def row_line(r: dict[str, Any]) -> str:
    """One line per setting for the terminal."""
    if r["status"] != "ok":
        return f"{r['setting']:<32} FAILED: {r['error']}"
    sph, speedup = r.get("steps_per_hour") or 0, r.get("speedup_vs_sync") or 0
    reward = r.get("reward_at_equal_time")
    return (
        f"{r['setting']:<32} steps/h {sph:9.0f}  speedup {speedup:5.2f}x  "
        f"learner idle {r.get('learner_idle_frac') or 0:4.0%}  "
        f"staleness max {r.get('staleness_max_trained')}  "
        f"reward at sync time {'-' if reward is None else format(reward, '.3f')}"
    )


def failed(error: str) -> dict[str, Any]:
    """The row of a setting that could not finish, saying why."""
    return {"status": "failed", "error": error}
