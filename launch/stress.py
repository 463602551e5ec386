"""`asyncgrpo stress`: a grid of real pipeline runs under different staleness settings.

Every setting is a full run (consumer + producers as processes over ZeroMQ, launch/local.py) in
`OUT/runs/<setting>/`; this module only builds their configs and reads their files afterwards:
`metrics.jsonl`, `leases.jsonl`, `ledger.json` (and `eval.json` for learning runs). Outputs:
`results.csv` (one row per setting), `summary.md`, and plots in `OUT/plots/`.

Engines: `fake` measures scheduling and transport only (simulated learner step of `step_s`,
fake generation of `gen_s` per group, seeded coin rewards); `demo` trains the embedded model
(real learning: held-out accuracy at equal steps, and at equal wall-clock through the learner's
periodic evaluation).

Definitions (per setting):
- `steps_per_hour = 3600 * steps / wall_s`, with `wall_s` from the first snapshot to the last
  step (the learner's clock); `speedup_vs_sync` divides it by the `max_staleness = 0` run that
  shares every other setting (same code, same machine).
- `learner_idle_frac = Σ wait_s / wall_s` (time the learner waited for groups);
  `producer_idle_frac = 1 - Σ busy_s / Σ uptime_s` (time producers held no lease in progress).
- `ess`: mean per-step effective sample size of the TIS token weights, `(Σw)² / (n Σw²)`.
- `dropped_stale_mean_tokens` vs `trained_mean_tokens`: whether dropping favours short samples.
"""

from __future__ import annotations

import csv
import itertools
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from common import config as C
from common.metrics import read_jsonl, read_steps

COLUMNS = [
    "setting", "max_staleness", "producers", "engine", "is_mode", "steps", "wall_s",
    "steps_per_hour", "speedup_vs_sync", "groups_per_s", "tokens_per_s", "learner_idle_frac",
    "producer_idle_frac", "trained", "dropped_stale", "dropped_zero_variance", "expired",
    "staleness_mean_trained", "staleness_max_trained", "staleness_hist", "tis_weight_mean",
    "tis_frac_truncated", "ess", "trained_mean_tokens", "dropped_stale_mean_tokens",
    "expired_by_producer", "dropped_stale_by_producer", "final_reward", "final_accuracy",
    "accuracy_at_equal_time",
]  # fmt: skip
# "off", then every TIS level-mode pair of the config ("token-truncate", ...).
IS_MODES = (
    "off",
    *(f"{level}-{mode}" for level in get_args(C.TISLevel) for mode in get_args(C.TISMode)),
)


@dataclass(frozen=True)
class Scenario:
    """Heterogeneity injected into every setting of a sweep."""

    gen_s: float = 0.5  # fake engine: seconds per group
    step_s: float = 0.5  # fake engine: simulated learner step
    slow_factor: float = 1.0  # producer p1 generates this many times slower
    jitter: float = 0.0
    long_tail: float = 0.0
    stall_s: float = 0.0  # producer p2 stalls this long after stall_after_s
    stall_after_s: float = 5.0
    publish_delay_s: float = 0.0
    max_in_flight: int = 8  # leases a producer may hold (the staleness bound still caps them)
    seed: int = 0


def setting_name(ms: int, producers: int, is_mode: str) -> str:
    return f"ms{ms}-p{producers}-{is_mode}"


def is_overrides(is_mode: str) -> dict[str, object]:
    if is_mode == "off":
        return {"loss.tis": False}
    level, mode = is_mode.split("-")
    return {"loss.tis": True, "loss.tis_level": level, "loss.tis_mode": mode}


def build_config(
    base: C.Config,
    *,
    ms: int,
    is_mode: str,
    engine: str,
    steps: int,
    sc: Scenario,
    run_dir: Path,
    threads: dict[str, int] | None = None,
) -> C.Config:
    values: dict[str, object] = {
        "staleness.max_staleness": ms, "staleness.publish_every": 1, "run.steps": steps,
        "run.seed": sc.seed, "run.dir": run_dir, "net.control_port": 0,
        "snapshot.delay_s": sc.publish_delay_s, "producer.max_in_flight": sc.max_in_flight,
        **is_overrides(is_mode), **(threads or {}),
    }  # fmt: skip
    if engine == "fake":
        values |= {
            "train.simulate_step_s": sc.step_s, "producer.engine": "fake",
            "fake.latency_s": sc.gen_s, "fake.jitter": sc.jitter, "fake.long_tail": sc.long_tail,
        }  # fmt: skip
    return C.override(base, values)


def producer_args(index: int, sc: Scenario) -> list[str]:
    """Per-producer injections: p1 is the slow one, p2 the one that stalls."""
    args: list[str] = []
    if index == 0 and sc.slow_factor != 1.0:
        args += ["--set", f"producer.slow_factor={sc.slow_factor}"]
    if index == 1 and sc.stall_s > 0:
        args += [
            "--set",
            f"producer.stall_s={sc.stall_s}",
            "--set",
            f"producer.stall_after_s={sc.stall_after_s}",
        ]
    return args


def run_sweep(
    base: C.Config,
    out: Path,
    *,
    staleness: list[int],
    producers: list[int],
    is_modes: list[str],
    engine: str,
    steps: int,
    scenario: Scenario,
    live: bool = False,
    given: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """Run every setting. With the demo engine, the learner's and producers' torch threads
    follow the cores rule (launch/cores.py) for each producer count, unless `given`."""
    from launch import cores, local

    rows = []
    for ms, n, is_mode in itertools.product(staleness, producers, is_modes):
        name = setting_name(ms, n, is_mode)
        run_dir = out / "runs" / name
        run_dir.mkdir(parents=True, exist_ok=True)
        threads = None
        if engine == "demo":
            split = cores.plan(
                cores.usable_cores(), max_staleness=ms,
                prompts_per_step=base.train.prompts_per_step, producers=n,
            )  # fmt: skip
            rule = {
                "model.torch_threads": split.learner_threads,
                "producer.torch_threads": split.producer_threads,
            }
            threads = {k: v for k, v in rule.items() if k not in given}
        cfg = build_config(
            base, ms=ms, is_mode=is_mode, engine=engine, steps=steps, sc=scenario,
            run_dir=run_dir, threads=threads,
        )  # fmt: skip
        C.validate(cfg)
        C.write(cfg, run_dir / "config.toml")
        code = local.run(
            run_dir / "config.toml", run_dir, steps=steps, num_producers=n, live=live,
            producer_args=lambda i: producer_args(i, scenario),
        )  # fmt: skip
        if code != 0:
            raise RuntimeError(f"setting {name} failed (exit {code}): see {run_dir}")
        if engine == "demo" and cfg.model.path:
            from consumer.evaluate import evaluate_run

            evaluate_run(run_dir, Path(cfg.model.path), initial=False)
        rows.append(
            {
                "setting": name,
                "max_staleness": ms,
                "producers": n,
                "engine": engine,
                "is_mode": is_mode,
                **measure(run_dir),
            }
        )
    add_speedups(rows)
    write_outputs(out, rows)
    return rows


def measure(run_dir: Path) -> dict[str, Any]:
    """One results row from a finished run's files."""
    metrics = read_steps(run_dir / "metrics.jsonl")
    leases = read_jsonl(run_dir / "leases.jsonl")
    ledger = json.loads((run_dir / "ledger.json").read_text())
    bal = ledger["balance"]
    steps = len(metrics)
    start = metrics[0].time_s - metrics[0].step_wall_s if metrics else 0.0
    wall = metrics[-1].time_s - start if metrics else 0.0
    trained = [r for r in leases if r["state"] == "trained"]
    stale = [r for r in leases if r["state"] == "dropped_stale"]
    lags = [r["trained_step"] - r["behavior_version"] for r in trained]
    busy = uptime = 0.0
    for view in (metrics[-1].producer_counters if metrics else {}).values():
        busy += view.get("busy_s", 0.0)
        uptime += view.get("uptime_s", 0.0)
    ev = json.loads((run_dir / "eval.json").read_text()) if (run_dir / "eval.json").exists() else {}

    def mean(xs: list[float]) -> float | None:
        return statistics.fmean(xs) if xs else None

    def measured(xs: Iterable[float | None]) -> float | None:
        return mean([x for x in xs if x is not None])

    def by_producer(state: str) -> str:
        return json.dumps({p: c.get(state, 0) for p, c in sorted(ledger["by_producer"].items())})

    return {
        "steps": steps,
        "wall_s": wall,
        "steps_per_hour": 3600 * steps / wall if wall > 0 else None,
        "groups_per_s": bal["trained"] / wall if wall > 0 else None,
        "tokens_per_s": sum(m.num_completion_tokens for m in metrics) / wall if wall > 0 else None,
        "learner_idle_frac": sum(m.wait_s for m in metrics) / wall if wall > 0 else None,
        "producer_idle_frac": 1 - busy / uptime if uptime > 0 else None,
        "trained": bal["trained"],
        "dropped_stale": bal["dropped_stale"],
        "dropped_zero_variance": bal["dropped_zero_variance"],
        "expired": bal["expired"],
        "staleness_mean_trained": mean(lags),
        "staleness_max_trained": max(lags) if lags else None,
        "staleness_hist": json.dumps({k: lags.count(k) for k in sorted(set(lags))}),
        "tis_weight_mean": measured(m.tis_weight_mean for m in metrics),
        "tis_frac_truncated": measured(m.tis_frac_truncated for m in metrics),
        "ess": measured(m.tis_ess for m in metrics),
        "trained_mean_tokens": mean([r["num_tokens"] for r in trained]),
        "dropped_stale_mean_tokens": mean([r["num_tokens"] for r in stale]),
        "expired_by_producer": by_producer("expired"),
        "dropped_stale_by_producer": by_producer("dropped_stale"),
        "final_reward": mean([m.reward_mean for m in metrics[-10:]]),
        "final_accuracy": ev.get("final_accuracy"),
        "accuracy_at_equal_time": None,  # filled by add_speedups
        "_accuracy_curve": [
            (m.time_s - start, m.heldout_accuracy)
            for m in metrics
            if m.heldout_accuracy is not None
        ],
    }


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """speedup_vs_sync against the ms=0 row with the same producers and IS mode; accuracy of each
    run at the wall-clock time the synchronous run took (its last periodic evaluation before)."""
    for row in rows:
        sync = next(
            (
                r
                for r in rows
                if r["max_staleness"] == 0
                and r["producers"] == row["producers"]
                and r["is_mode"] == row["is_mode"]
            ),
            None,
        )
        if sync and sync.get("steps_per_hour") and row.get("steps_per_hour"):
            row["speedup_vs_sync"] = row["steps_per_hour"] / sync["steps_per_hour"]
        else:
            row["speedup_vs_sync"] = None
        if sync and row.get("_accuracy_curve"):
            before = [acc for t, acc in row["_accuracy_curve"] if t <= sync["wall_s"] + 1e-9]
            row["accuracy_at_equal_time"] = before[-1] if before else None


def write_outputs(out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row.get(k)) for k in COLUMNS})
    from launch.stress_plots import plot_all

    plots = plot_all(out, rows)
    (out / "summary.md").write_text(summary(rows, plots))
    return [out / "results.csv", out / "summary.md", *plots]


def _cell(v: Any) -> Any:
    return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else v)


def summary(rows: list[dict[str, Any]], plots: list[Path]) -> str:
    head = [
        "setting", "steps_per_hour", "speedup_vs_sync", "learner_idle_frac", "producer_idle_frac",
        "staleness_max_trained", "dropped_stale", "expired", "tis_weight_mean", "ess",
        "final_accuracy",
    ]  # fmt: skip
    lines = ["# Staleness sweep", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join(str(_cell(r.get(k))) for k in head) + " |")
    best = max(
        (r for r in rows if r.get("steps_per_hour")),
        key=lambda r: r["steps_per_hour"],
        default=None,
    )
    if best is not None:
        lines += ["", f"Fastest: `{best['setting']}` ({_cell(best['steps_per_hour'])} steps/hour)."]
    knee = [r for r in rows if (r.get("learner_idle_frac") or 1) < 0.1]
    if knee:
        first = min(knee, key=lambda r: r["max_staleness"])
        lines.append(
            "The learner stops waiting (idle < 10%) from "
            f"max_staleness = {first['max_staleness']}: "
            "beyond it, producers are no longer the bottleneck."
        )
    lines += ["", "## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots]
    return "\n".join(lines) + "\n"
