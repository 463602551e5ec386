"""`asyncgrpo status` and `asyncgrpo report`: where a run stands and its plots, from its files
(running or finished; launch/dashboard.py and launch/report.py read them). A stress sweep's
directory is not a run: `report` writes the sweep's own summary and plots again
(launch/stress/run.py), `status` says where its runs are."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from common.errors import ConfigError
from common.files import run_files as RF
from launch.cli.app import fail


def report(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(help="A run directory, or a stress sweep's --out; several runs: overlaid."),
    ],
    out: Annotated[
        Path | None,
        typer.Option(help="Several runs: the figure to write (default: FIRST/plots/compare.png)."),
    ] = None,
) -> None:
    """Write PNG plots (RUN_DIR/plots) and summary.md for a run, finished or not; for a stress
    sweep's directory, its results.csv, summary.md and plots again. Several runs (a run and its
    replays): their loss, reward, ratio and held-out curves overlaid in one figure."""
    from launch.report import report as write_report
    from launch.stress.run import is_sweep, report_sweep

    for run_dir in run_dirs:
        if not run_dir.is_dir():
            fail(f"{run_dir} is not a directory")
    if len(run_dirs) > 1:
        from launch.compare import overlay

        for run_dir in run_dirs:
            if not (run_dir / RF.METRICS).exists():
                fail(f"{run_dir} is not a run directory (no {RF.METRICS})")
        written = [overlay(run_dirs, out or run_dirs[0] / RF.PLOTS / "compare.png")]
    elif is_sweep(run_dir := run_dirs[0]):
        try:
            written = report_sweep(run_dir)
        except ConfigError as exc:
            fail(str(exc))
    elif (run_dir / RF.CONFIG).exists() or (run_dir / RF.METRICS).exists():
        written = write_report(run_dir)
    else:
        fail(f"{run_dir} is not a run directory (no config.toml or metrics.jsonl)")
    for path in written:
        typer.echo(f"wrote {path}")


def status(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    """Where a run stands (running, finished, or stopped without finishing), from its files:
    the last step, the ledger, refused messages, each producer's weights, groups and reward
    failures."""
    from launch.dashboard import status as run_status
    from launch.stress.run import is_sweep

    if is_sweep(run_dir):
        fail(
            f"{run_dir} is a stress sweep, not one run: its summary.md and results.csv compare "
            f"its settings; `asyncgrpo status {run_dir}/runs/SETTING` shows one of them"
        )
    if not (run_dir / RF.CONFIG).exists():
        fail(f"{run_dir} is not a run directory (no config.toml)")
    typer.echo(run_status(run_dir))
