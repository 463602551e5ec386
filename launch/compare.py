"""`asyncgrpo report RUN_A RUN_B ...`: several runs' curves overlaid in one figure.

Made for a run and its counterfactual replays (`asyncgrpo replay --set loss.tis_cap=...`):
the same data, another learner setting. Reads each run's `metrics.jsonl`; one PNG of four
panels against the optimizer step, one line per run (named by its directory):
- the loss of each step's batch (`loss`; absent from runs older than the field);
- the batch reward mean;
- the importance ratios' extremes (`ratio_max` solid, `ratio_min` dashed) and the TIS weight
  mean (dotted);
- held-out greedy accuracy, where the run evaluated (`eval.learner_every_steps`).
"""

from __future__ import annotations

from pathlib import Path

from common.files import run_files as RF
from common.files.metrics import StepRecord, read_steps
from launch.report import _series, save_figure

PANELS = ("loss", "batch reward mean", "ratio max / min, TIS weight mean", "held-out accuracy")


def overlay(run_dirs: list[Path], out: Path) -> Path:
    """Write the figure comparing `run_dirs` to `out` (a .png path); returns it."""
    import matplotlib.pyplot as plt  # its backend is chosen where launch/report.py is imported

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    ax_loss, ax_reward, ax_ratio, ax_eval = axes.flat
    for run_dir in run_dirs:
        records = read_steps(run_dir / RF.METRICS)
        name = run_dir.name
        (line,) = ax_loss.plot(*_series(records, _loss), label=name, alpha=0.8)
        color = line.get_color()
        ax_reward.plot(*_series(records, lambda r: r.reward_mean), color=color, label=name)
        ax_ratio.plot(*_series(records, lambda r: r.ratio_max), color=color, label=name)
        ax_ratio.plot(*_series(records, lambda r: r.ratio_min), "--", color=color)
        ax_ratio.plot(*_series(records, lambda r: r.tis_weight_mean), ":", color=color)
        xs, ys = _series(records, lambda r: r.heldout_accuracy)
        if xs:
            ax_eval.plot(xs, ys, "o-", color=color, label=name)
    for ax, title in zip(axes.flat, PANELS, strict=True):
        ax.set_title(title)
        if ax.lines:
            ax.legend(fontsize="small")
    for ax in axes[1]:
        ax.set_xlabel("optimizer step")
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, out)


def _loss(r: StepRecord) -> float | None:
    return r.loss
