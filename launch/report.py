"""`asyncgrpo report RUN_DIR`: PNG plots and a Markdown summary of one run, from its files.

Reads `metrics.jsonl` (one line per step), `leases.jsonl` (one line per finished lease),
`ledger.json`, `eval.json` and `completions.jsonl` (if present: the newest sample is shown).
Writes `plots/*.png` and `summary.md` (reward calls that failed or timed out included):
- reward.png: reward mean over every arrived group and over the trained ones, the share of
  groups with equal rewards, per-function means, held-out greedy accuracy when the learner
  evaluated, and the producers' evaluation (`[eval]`: pass@1, pass@k at the version
  evaluated), vs step (the axis follows the data); summary.md lists each evaluated version
  (consumer/evaluation/report.py);
- staleness.png: histogram of learner_version - behavior_version over trained groups;
- tis.png: TIS weight mean and fraction truncated vs step;
- throughput.png: completion tokens/s and learner idle fraction over wall time;
- lag.png: the learner's version and every producer's loaded weight version over wall time.
Works on partial runs (a run stopped early plots what it has; a plot with nothing to show, such
as staleness before any group was trained, is not written).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from common.files import completions_file as CF
from common.files import run_files as RF
from common.files import run_state as RS
from common.files.metrics import StepRecord, read_steps
from consumer.evaluation.report import eval_lines, eval_series
from launch.dashboard import ledger_text, reward_failures, run_clock, run_state
from launch.headline import no_signal, signal_text


def _fn_mean(name: str) -> Callable[[StepRecord], float | None]:
    """One reward function's mean of a step (None where the step has none)."""
    return lambda r: (r.reward_fn_means or {}).get(name)


def _series(
    records: list[StepRecord], value: Callable[[StepRecord], float | None]
) -> tuple[list[float], list[float]]:
    """(steps, values) of the records where `value` was measured."""
    xs: list[float] = []
    ys: list[float] = []
    for r in records:
        v = value(r)
        if v is not None:
            xs.append(float(r.step))
            ys.append(v)
    return xs, ys


def save_figure(fig: Any, path: Path) -> Path:
    """Write `fig` as a PNG (the one style of every plot here and in the sweep) and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_reward(records: list[StepRecord], out: Path) -> Path:
    """The reward over every arrived group (the headline), over the trained groups, the share
    of groups with equal rewards, per-function means and held-out accuracy, against the step.
    The axis follows the data (a reward summed with weights may exceed 1 or go below 0)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    series = [
        (_series(records, lambda r: r.reward_mean_seen), "reward (all arrived groups)", "-"),
        (_series(records, lambda r: r.reward_mean), "reward (trained groups)", "-"),
        (
            _series(records, lambda r: r.frac_reward_zero_std),
            "share of groups with equal rewards",
            ":",
        ),
        (_series(records, lambda r: r.heldout_accuracy), "held-out greedy accuracy", "o-"),
    ]
    series += [((xs, ys), label, "s-") for xs, ys, label in eval_series(records)]
    for name in _fn_names(records):
        series.append((_series(records, _fn_mean(name)), name, "--"))
    values: list[float] = []
    for (xs, ys), label, style in series:
        if xs:
            ax.plot(xs, ys, style, label=label, alpha=0.8)
            values += ys
    low, high = min([0.0, *values]), max([1.0, *values])
    pad = 0.02 * (high - low)
    ax.set_ylim(low - pad, high + pad)
    ax.set_xlabel("optimizer step")
    ax.legend(fontsize="small")
    ax.set_title("reward and accuracy")
    return save_figure(fig, out / "reward.png")


def _fn_names(records: list[StepRecord]) -> list[str]:
    """The reward functions with per-function means in any record, in first-seen order."""
    return list(dict.fromkeys(n for r in records for n in (r.reward_fn_means or {})))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def windows(n: int) -> int:
    """The length of summary.md's first and last windows over `n` steps: 10, or half the run
    when it is shorter (so the two never share a step; 1 step: one window)."""
    return min(10, max(n // 2, 1))


def reward_lines(records: list[StepRecord]) -> list[str]:
    """summary.md's reward lines: the headline reward over every arrived group, the trained
    groups' mean and the share of equal-reward groups, per-function means (first and last k
    steps, `windows`; one figure for a one-step run), and the "no signal" warning when the
    last step had none."""
    k = windows(len(records))
    first, last = records[:k], records[-k:]

    def both(label: str, values: Callable[[list[StepRecord]], float], spec: str) -> str:
        if len(records) == 1:
            return f"- {label}: {values(first):{spec}} (1 step)"
        n = f"{k} steps" if k > 1 else "step"
        return f"- {label}: first {n} {values(first):{spec}}, last {n} {values(last):{spec}}"

    out = [
        both(
            "reward mean (all arrived groups)",
            lambda rs: _mean([r.reward_headline for r in rs]),
            ".3f",
        ),
        both("reward mean (trained groups)", lambda rs: _mean([r.reward_mean for r in rs]), ".3f"),
        both(
            "groups with equal rewards (no signal)",
            lambda rs: _mean([r.frac_reward_zero_std for r in rs]),
            ".0%",
        ),
    ]
    for name in _fn_names(records):
        per = [(r.reward_fn_means or {}).get(name) for r in records]
        got = [v for v in per if v is not None]
        j = windows(len(got))
        out.append(
            f"- reward `{name}` (unweighted, all arrived groups): first {_mean(got[:j]):.3f}, "
            f"last {_mean(got[-j:]):.3f}"
        )
    warning = no_signal(records[-1])
    if warning:
        out.append(f"- **warning**: {warning}")
    return out


def staleness_counts(leases: list[RF.LeaseLine]) -> Counter[int]:
    return Counter(r.staleness for r in leases if r.state == "trained")


def plot_staleness(leases: list[RF.LeaseLine], out: Path) -> Path:
    counts = staleness_counts(leases)
    fig, ax = plt.subplots(figsize=(6, 4))
    lags = sorted(counts)
    ax.bar([str(k) for k in lags], [counts[k] for k in lags])
    ax.set_xlabel("staleness (learner version - behaviour version)")
    ax.set_ylabel("trained groups")
    ax.set_title("staleness of trained groups")
    return save_figure(fig, out / "staleness.png")


def plot_tis(records: list[StepRecord], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*_series(records, lambda r: r.tis_weight_mean), label="TIS weight mean")
    ax.plot(*_series(records, lambda r: r.tis_frac_truncated), label="fraction truncated/masked")
    gap = _series(records, lambda r: r.behavior_gap_abs_mean)
    ax.plot(*gap, label="mean |old - behaviour| log-prob")
    ax.set_xlabel("optimizer step")
    ax.legend()
    ax.set_title("truncated importance sampling")
    return save_figure(fig, out / "tis.png")


def plot_throughput(records: list[StepRecord], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    t = [r.time_s for r in records]
    ax.plot(t, [r.tokens_per_s for r in records], label="completion tokens/s")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("tokens/s")
    ax2 = ax.twinx()
    ax2.plot(
        t,
        [r.learner_idle_frac for r in records],
        color="tab:red",
        alpha=0.6,
        label="learner idle",
    )
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("learner idle fraction")
    fig.legend(loc="upper right")
    ax.set_title("throughput")
    return save_figure(fig, out / "throughput.png")


def weight_versions(
    records: list[StepRecord], history: list[RF.ProducerChange]
) -> dict[str, list[tuple[float, int]]]:
    """{producer: [(time_s, loaded weight version)]} on the metrics' clock: from
    producers.jsonl (`history`, common/files/run_files.py), or, in a run older than that file, from
    the per-producer fields of every metrics line."""
    out: dict[str, list[tuple[float, int]]] = {}
    if history and records:
        offset = records[0].time_s - records[0].unix_time  # unix time -> time_s
        for row in history:
            out.setdefault(row.producer, []).append((row.unix_time + offset, row.version))
        return out
    for r in records:
        for name, view in RF.producers_of_line(r).items():
            out.setdefault(name, []).append((r.time_s, view.version))
    return out


def plot_lag(records: list[StepRecord], history: list[RF.ProducerChange], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    t = [r.time_s for r in records]
    ax.plot(t, [r.step for r in records], label="learner version", linewidth=2)
    for name, pts in sorted(weight_versions(records, history).items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=f"{name} weights", alpha=0.7)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("version")
    ax.legend()
    ax.set_title("learner vs producer weight versions")
    return save_figure(fig, out / "lag.png")


def reward_failures_line(views: dict[str, RF.ProducerStatus], first_error: str = "") -> str:
    """Reward calls that failed or timed out (scored 0), in total and per producer (`views`:
    common/files/run_files.py `latest_producers`), and the run's first failure when known
    (`signal.json`)."""
    errors, timeouts = reward_failures(views)
    per = {name: (v.reward_errors, v.reward_timeouts) for name, v in sorted(views.items())}
    shown = ", ".join(f"{n} {e}/{t}" for n, (e, t) in per.items() if e or t)
    where = "the producers' logs give the exceptions"
    if first_error:
        where = f"the first: {first_error}"
    return f"- reward failures (scored 0): errors {errors}, timeouts {timeouts}" + (
        f" (errors/timeouts per producer: {shown}; {where})" if shown else ""
    )


def _first_error(run_dir: Path) -> str:
    signal = RS.read_signal(run_dir)
    return signal.first_error if signal is not None else ""


def summarize(run_dir: Path) -> str:
    records = read_steps(run_dir / RF.METRICS)
    leases = RF.read_leases(run_dir)
    ledger = RF.read_ledger(run_dir) if (run_dir / RF.LEDGER).exists() else None
    ev = json.loads((run_dir / RF.EVAL).read_text()) if (run_dir / RF.EVAL).exists() else {}
    lines = [f"# Run {run_dir.name}", "", *ending_lines(run_dir)]
    if records:
        last, first = records[-1], records[0]
        lines += [
            f"- steps: {last.step} in {last.time_s:.0f} s",
            *reward_lines(records),
            f"- staleness of trained groups: {dict(sorted(staleness_counts(leases).items()))}",
            "- learner idle fraction (mean): "
            f"{sum(r.learner_idle_frac for r in records) / len(records):.3f}",
            "- completion tokens/s (mean): "
            f"{sum(r.tokens_per_s for r in records) / len(records):.0f}",
            first_step_line(run_dir, first),
            reward_failures_line(RF.latest_producers(run_dir, last), _first_error(run_dir)),
        ]
    if ev:
        lines += [
            f"- held-out {ev.get('heldout', 'greedy accuracy')}: "
            f"{ev.get('initial_accuracy', float('nan')):.3f} → "
            f"{ev.get('final_accuracy', float('nan')):.3f} (n = {ev.get('heldout_size')})"
        ]
    watched = signal_text(RS.read_signal(run_dir), stepped=bool(records))
    if watched:
        lines += [f"- groups and their signal: {watched}"]
    elif not records and ledger is not None and no_signal(None, ledger.balance):
        lines += [f"- **warning**: {no_signal(None, ledger.balance)}"]
    if ledger is not None:
        lines += ["", "## Ledger", "", ledger_text(ledger.balance)]
        refused = ledger.refused()
        if refused:
            shown = ", ".join(f"{k} {v}" for k, v in sorted(refused.items()))
            lines += ["", f"Refused messages and connections: {shown}."]
    lines += eval_lines(records)
    lines += completions_lines(run_dir)
    lines += ["", "## Plots", ""] + [
        f"![{p.stem}]({RF.PLOTS}/{p.name})" for p in sorted((run_dir / RF.PLOTS).glob("*.png"))
    ]
    return "\n".join(lines) + "\n"


def ending_lines(run_dir: Path) -> list[str]:
    """How the run ended, first thing in summary.md when it stopped early (final.json; a run
    still going, or one whose consumer died, says so too)."""
    final = RS.read_final(run_dir)
    if final is not None and final.finished:
        return []
    return [f"**{run_state(run_dir)}**", ""]


def first_step_line(run_dir: Path, first: StepRecord) -> str:
    """When the first step came, on the clock the console counts (from the consumer's
    start: loading the model, the first snapshot and the producers' start included), with the
    learner's own (`time_s`, from its first group) beside it."""
    since_start = run_clock(run_dir, first)
    if since_start == first.time_s:  # a run older than consumer.json's `began`
        return f"- first step at {first.time_s:.1f} s"
    return (
        f"- first step {since_start:.1f} s after the consumer started "
        f"({first.time_s:.1f} s after its first group arrived)"
    )


def completions_lines(run_dir: Path, max_rows: int = 16) -> list[str]:
    """summary.md's section of the newest completions sample (completions.jsonl), if any; step
    0 is the first groups of the run, written before its first step."""
    rows = CF.read(run_dir)
    if not rows:
        return []
    newest = [r for r in rows if r.step == rows[-1].step][:max_rows]
    when = f"at step {newest[0].step}" if newest[0].step else "before the first step"
    return [
        "",
        f"## Completions {when}",
        "",
        f"From `{CF.COMPLETIONS}` (every `log.completions_every` steps, and the first groups "
        "before the first step):",
        "",
        CF.markdown_table(newest),
    ]


def report(run_dir: Path) -> list[Path]:
    """Write every plot and summary.md; returns the files written."""
    out = run_dir / RF.PLOTS
    out.mkdir(exist_ok=True)
    records = read_steps(run_dir / RF.METRICS)
    leases = RF.read_leases(run_dir)
    written = []
    if records:
        written += [
            plot_reward(records, out),
            plot_tis(records, out),
            plot_throughput(records, out),
            plot_lag(records, RF.read_producer_history(run_dir), out),
        ]
    if staleness_counts(leases):
        written.append(plot_staleness(leases, out))
    (run_dir / RF.SUMMARY).write_text(summarize(run_dir))
    return [*written, run_dir / RF.SUMMARY]
