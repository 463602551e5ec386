"""`asyncgrpo status` and `asyncgrpo report`: where a run stands and its plots, from its files
(running or finished; launch/dashboard.py and launch/report.py read them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from common import run_files as RF
from launch.cli.app import fail


def report(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    """Write PNG plots (RUN_DIR/plots) and summary.md for a run, finished or not."""
    from launch.report import report as write_report

    if not run_dir.is_dir():
        fail(f"{run_dir} is not a directory")
    for path in write_report(run_dir):
        typer.echo(f"wrote {path}")


def status(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    """Where a run stands (running or finished), from its files: the last step, the ledger,
    refused messages, each producer's weights, groups and reward failures."""
    from launch.dashboard import status as run_status

    if not (run_dir / RF.CONFIG).exists():
        fail(f"{run_dir} is not a run directory (no config.toml)")
    typer.echo(run_status(run_dir))
