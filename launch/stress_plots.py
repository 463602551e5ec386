"""Plots of a staleness sweep (launch/stress.py rows): one PNG per question a user asks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from launch.report import save_figure


def _lines(ax: Any, rows: list[dict[str, Any]], key: str, label: str) -> None:
    """One line per (producers, is_mode) series, max_staleness on x."""
    series: dict[tuple[int, str], list[tuple[int, float]]] = {}
    for r in rows:
        if r.get(key) is not None:
            series.setdefault((r["producers"], r["is_mode"]), []).append(
                (r["max_staleness"], r[key])
            )
    for (n, mode), pts in sorted(series.items()):
        pts.sort()
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            "o-",
            label=f"{label} · {n} producers · IS {mode}",
        )
    ax.set_xlabel("max_staleness")


def plot_all(out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(7, 4))
    _lines(ax, rows, "steps_per_hour", "steps/hour")
    ax.set_ylabel("steps per hour")
    ax.legend(fontsize=7)
    ax.set_title("throughput vs staleness")
    written.append(save_figure(fig, plots / "throughput_vs_staleness.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    _lines(ax, rows, "learner_idle_frac", "learner idle")
    _lines(ax, rows, "producer_idle_frac", "producer idle")
    ax.set_ylim(0, 1)
    ax.set_ylabel("idle fraction")
    ax.legend(fontsize=7)
    ax.set_title("who waits: learner vs producers")
    written.append(save_figure(fig, plots / "idle_fractions.png"))

    if any(r.get("final_accuracy") is not None for r in rows):
        fig, ax = plt.subplots(figsize=(7, 4))
        _lines(ax, rows, "final_accuracy", "held-out accuracy (equal steps)")
        _lines(ax, rows, "accuracy_at_equal_time", "held-out accuracy (equal wall-clock)")
        ax.set_ylabel("greedy held-out accuracy")
        ax.legend(fontsize=7)
        ax.set_title("accuracy vs staleness")
        written.append(save_figure(fig, plots / "accuracy_vs_staleness.png"))

    fig, axes = plt.subplots(1, len(rows), figsize=(3 * len(rows), 3), squeeze=False)
    for ax, r in zip(axes[0], rows, strict=True):
        hist = json.loads(r["staleness_hist"]) if r.get("staleness_hist") else {}
        ax.bar(list(hist), list(hist.values()))
        ax.set_title(r["setting"], fontsize=8)
        ax.set_xlabel("staleness")
    axes[0][0].set_ylabel("trained groups")
    written.append(save_figure(fig, plots / "staleness_histograms.png"))
    return written
