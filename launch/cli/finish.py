"""After a `launch`'s run: what it ends with, said truthfully.

- A run that could not start or go on (a configuration error: exit 2) ends there: its one-line
  reason was printed by the supervisor (launch/local.py), nothing is evaluated, and a run
  directory this command created, where no step was trained, is removed (`end_failed`).
- Otherwise how it ended, when it stopped early (a Ctrl-C, no learning signal: final.json),
  the held-out evaluation of the starting model and the run's final snapshot (with
  progress lines: it can take minutes on a real model; skipped when no step was trained, as
  both would be the same model, and by a second Ctrl-C), then the summary and plots (`finish`).
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from common import config as C
from common.files import run_state as RS
from common.progress import Counter
from launch.cli.app import NewRunDir, discard_failed_start


def end_failed(claimed: NewRunDir, code: int) -> None:
    """A run that stopped on a configuration error: its directory removed when this command
    created it and trained nothing in it; exits with `code`."""
    if discard_failed_start(claimed):
        typer.echo(f"removed {claimed.path}: the run never started", err=True)
    raise typer.Exit(code)


def finish(cfg: C.Config, run_dir: Path, evaluate_with: Path | None) -> None:
    """The held-out evaluation (with `evaluate_with`, the starting model's directory; a Ctrl-C
    skips it), then the summary and plots (a Ctrl-C there leaves them to `asyncgrpo report
    RUN_DIR`)."""
    from launch.dashboard import run_state
    from launch.report import report as write_report

    final = RS.read_final(run_dir)
    if final is not None and not final.finished:  # the reason it stopped early, on the console
        typer.secho(run_state(run_dir), fg=typer.colors.YELLOW, err=True)
    if evaluate_with is not None and final is not None and final.version == 0:
        typer.echo("no step was trained: nothing to evaluate", err=True)
    elif evaluate_with is not None:
        try:
            _score_ends(cfg, run_dir, evaluate_with)
        except KeyboardInterrupt:
            typer.echo("evaluation skipped", err=True)
    try:
        for path in write_report(run_dir):
            typer.echo(f"wrote {path}", err=True)
    except KeyboardInterrupt:
        typer.echo(f"no summary written: `asyncgrpo report {run_dir}` writes it", err=True)


def _score_ends(cfg: C.Config, run_dir: Path, model_dir: Path) -> None:
    """The held-out score of the start and the final snapshot (consumer/evaluation/), if the
    task has a held-out split, with a progress line every 10 s or tenth of the problems."""
    from consumer import evaluation
    from producer.rewards.judge import HeldOutJudge

    if not evaluation.has_heldout(cfg):
        return
    typer.echo(
        f"evaluating the start and the final snapshot: {evaluation.describe(cfg)} "
        "(Ctrl-C: skip it)",
        err=True,
    )
    t0 = time.monotonic()

    def counter(which: str, total: int) -> Counter:
        return Counter(f"evaluating the {which}", total, _say, unit="problems")

    r = evaluation.score_run_ends(cfg, run_dir, model_dir, judge=HeldOutJudge, progress=counter)
    if r is None:
        typer.echo("no snapshot to evaluate", err=True)
        return
    start, final = r["initial_accuracy"], r["final_accuracy"]
    typer.secho(
        f"held-out {r['heldout']}: start {start:.1%} → final (v{r['final_version']}) "
        f"{final:.1%} on {r['heldout_size']} problems ({time.monotonic() - t0:.0f} s)",
        fg=typer.colors.GREEN if final > start else typer.colors.YELLOW,
        err=True,
    )


def _say(text: str) -> None:
    typer.echo(text, err=True)
