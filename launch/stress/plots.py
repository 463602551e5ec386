"""Plots of a staleness sweep (rows of launch/stress/results.py): one PNG per question a user
asks. Settings repeated over seeds are drawn as their mean with the range as an error bar
(`aggregate`); failed settings are left out. Every title says how many seeds stand behind a
point and, on a loaded machine, that it was (launch/stress/verdict.py `caveat`)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from launch.report import save_figure
from launch.stress.results import aggregate, variant_of
from launch.stress.verdict import caveat


def _lines(ax: Any, aggs: list[dict[str, Any]], key: str, label: str) -> None:
    """One line per (variant, producers, is_mode) series, max_staleness on x, seed range as
    error bars."""
    series: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for a in aggs:
        if a.get(key) is not None:
            series.setdefault((a["variant"], a["producers"], a["is_mode"]), []).append(a)
    for (variant, n, mode), pts in sorted(series.items()):
        pts.sort(key=lambda a: a["max_staleness"])
        ys = [a[key] for a in pts]
        low = [y - a[f"{key}_min"] for y, a in zip(ys, pts, strict=True)]
        high = [a[f"{key}_max"] - y for y, a in zip(ys, pts, strict=True)]
        ax.errorbar(
            [a["max_staleness"] for a in pts],
            ys,
            yerr=[low, high],
            fmt="o-",
            capsize=3,
            label=f"{label} · {n} producers · IS {mode}"
            + ("" if variant == "config" else f" · {variant}"),
        )
    ax.set_xlabel("max_staleness")


def _figure(
    path: Path, title: str, ylabel: str, draw: Callable[[Any], object], caveat: str = ""
) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    draw(ax)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}\n{caveat}" if caveat else title, fontsize=10 if caveat else None)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def _by_staleness(aggs: list[dict[str, Any]], *series: tuple[str, str]) -> Callable[[Any], None]:
    """Draws `(key, label)` series against max_staleness."""

    def draw(ax: Any) -> None:
        for key, label in series:
            _lines(ax, aggs, key, label)

    return draw


def plot_all(out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    ok = [r for r in rows if r.get("status") == "ok"]
    if not ok:
        return []
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    aggs = aggregate(ok)
    said = caveat(aggs, ok)
    figures = [
        (
            "throughput_vs_staleness",
            "throughput vs staleness",
            "steps per hour",
            [("steps_per_hour", "steps/hour")],
        ),
        (
            "idle_fractions",
            "who waits: learner vs producers",
            "idle fraction",
            [("learner_idle_frac", "learner idle"), ("producer_idle_frac", "producer idle")],
        ),
        (
            "reward_vs_staleness",
            "reward vs staleness",
            "mean reward (smoothed)",
            [("final_reward", "equal steps"), ("reward_at_equal_time", "equal wall-clock")],
        ),
    ]
    if any(r.get("final_accuracy") is not None for r in ok):
        figures.append(
            (
                "accuracy_vs_staleness",
                "held-out score vs staleness",
                str(ok[0].get("heldout") or "held-out score"),
                [("final_accuracy", "equal steps"), ("accuracy_at_equal_time", "equal wall-clock")],
            )
        )
    written = [
        _figure(plots / f"{name}.png", title, ylabel, _by_staleness(aggs, *series), said)
        for name, title, ylabel, series in figures
    ]
    written.append(
        _figure(
            plots / "reward_vs_time.png",
            "reward over wall-clock time",
            "mean reward (smoothed)",
            lambda ax: _curves(ax, ok),
            said,
        )
    )
    written.append(_histograms(plots / "staleness_histograms.png", aggs, ok))
    return written


def _curves(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Each run's smoothed reward over its clock; dashed: each synchronous run's end."""
    colors: dict[int, Any] = {}
    for r in rows:
        pts = r.get("_curve") or []
        if not pts:
            continue
        ms = r["max_staleness"]
        label = None if ms in colors else f"max_staleness {ms}"
        (line,) = ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            color=colors.get(ms),
            alpha=0.8,
            linewidth=1,
            label=label,
        )
        colors.setdefault(ms, line.get_color())
        if ms == 0:
            ax.axvline(r["wall_s"], color=line.get_color(), linestyle="--", linewidth=0.8)
    ax.set_xlabel("seconds since the first step started")


def _histograms(path: Path, aggs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> Path:
    """Staleness of trained groups per setting, summed over its seeds."""
    fig, axes = plt.subplots(1, len(aggs), figsize=(3 * len(aggs), 3), squeeze=False)
    for ax, a in zip(axes[0], aggs, strict=True):
        hist: Counter[int] = Counter()
        for r in rows:
            same = all(r[k] == a[k] for k in ("max_staleness", "producers", "is_mode"))
            if same and variant_of(r) == a["variant"]:
                hist.update({int(k): v for k, v in json.loads(r["staleness_hist"] or "{}").items()})
        ax.bar(list(hist), list(hist.values()))
        loss = "" if a["variant"] == "config" else f"-{a['variant']}"
        ax.set_title(f"ms{a['max_staleness']}-p{a['producers']}-{a['is_mode']}{loss}", fontsize=8)
        ax.set_xlabel("staleness")
    axes[0][0].set_ylabel("trained groups")
    return save_figure(fig, path)
