"""`asyncgrpo replay`: train again on a run's recorded stream (consumer/replay.py), bit for bit
with the run's own config, or with other learner settings on the same data.

The recording is checked whole before anything trains (consumer/stream/reader.py); the
settings a replay may change are consumer/stream/rules.py's. The replay is a run directory of
its own (config, metrics, ledger, snapshots, plots, its own stream). Afterwards every snapshot
hash both runs have is compared: `--verify` makes a difference an error (exit 1) and names the
first version that differs and the largest parameter difference there.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from common import config as C
from common.errors import ConfigError, EvalError, StreamError
from common.files import run_files as RF
from launch.cli.app import (
    ForceOpt,
    SetOpt,
    VerboseOpt,
    fail,
    load_config,
    new_run_dir,
    setup_logging,
)

if TYPE_CHECKING:
    from consumer.stream.reader import Recording

EPILOG = (
    "Replay a run exactly (every snapshot hash equal to the original's):\n\n"
    "`asyncgrpo replay runs/demo --run-dir runs/demo-replay`\n\n"
    "The same data with another TIS cap, then both runs' curves in one figure:\n\n"
    "`asyncgrpo replay runs/demo --run-dir runs/cap5 --set loss.tis_cap=5`\n\n"
    "`asyncgrpo report runs/demo runs/cap5`\n\n"
    "Check that a run replays bit for bit: `asyncgrpo replay --verify runs/demo`"
)


def replay(
    run: Annotated[Path, typer.Argument(help="The recorded run's directory.")],
    run_dir: Annotated[
        str | None,
        typer.Option("--run-dir", help="The replay's run directory (default: runs/TIMESTAMP)."),
    ] = None,
    steps: Annotated[
        int | None, typer.Option(help="Replay at most this many steps (default: all recorded).")
    ] = None,
    from_checkpoint: Annotated[
        int | None,
        typer.Option(
            "--from-checkpoint",
            help="Start from the run's checkpoint of this version instead of its initial model.",
        ),
    ] = None,
    set_: SetOpt = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Fail (exit 1) unless every snapshot hash equals the original's; name the first "
            "version that differs and the largest |Δparam| there.",
        ),
    ] = False,
    force: ForceOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Train again on a run's recorded batches, in the recorded order: no producers, no network.
    With the run's own config every snapshot has the original's BLAKE3 hash; `--set` may change
    learner settings (loss.*, train.lr, ...) for a counterfactual on the same data."""
    from consumer.stream import rules
    from consumer.stream.reader import index
    from consumer.stream.recorder import STREAM

    if not (run / RF.CONFIG).is_file():
        fail(f"{run} is not a run directory (no {RF.CONFIG})")
    try:
        recording = index(run / STREAM)
    except StreamError as exc:
        fail(f"replay refused: {exc}")
    fixed = {"run.resume": False, "run.dir": run_dir or ""}
    original = load_config(run / RF.CONFIG, None, fixed)
    if not any(s.startswith("snapshot.fsync=") for s in set_ or []):
        # a replay's snapshots can always be made again: no fsyncs unless asked for
        fixed["snapshot.fsync"] = "off"
    cfg = load_config(run / RF.CONFIG, set_, fixed)
    try:
        changes = rules.check(original, cfg)
    except ConfigError as exc:
        fail(str(exc))
    with new_run_dir(cfg, force, resumable=False) as claimed:  # a replay is never resumed
        out = claimed.path
        cfg = C.override(cfg, {"run.dir": out})
        C.write(cfg, out / RF.CONFIG)
    setup_logging(out, "replay", verbose)
    passes = rules.same_passes(original, cfg)  # else the recorded pass counts do not apply
    _run(cfg, out, run, recording, (steps, from_checkpoint, verify, passes), changes)


def _run(
    cfg: C.Config,
    out: Path,
    source: Path,
    recording: Recording,
    options: tuple[int | None, int | None, bool, bool],
    changes: list[str],
) -> None:
    from consumer.replay import Replay, compare
    from launch.dashboard import Progress
    from launch.report import report

    steps, from_checkpoint, verify, passes = options
    if recording.torn:
        typer.echo(f"note: {recording.torn}", err=True)
    shown = ", ".join(k for k in changes if not k.startswith(("run.", "snapshot."))) or "none"
    typer.echo(
        f"replaying {len(recording.steps)} recorded steps of {source} into {out} "
        f"(settings changed: {shown})",
        err=True,
    )
    total = len(recording.steps) if steps is None else min(steps, len(recording.steps))
    progress = Progress(out, total)  # a line every 10 s and at each tenth of the steps
    try:
        r = Replay(cfg, out, recording, source, check_passes=passes)
        if from_checkpoint is not None:
            r.start_from(from_checkpoint)
        progress.start()
        done = r.run(steps)
    except (StreamError, ConfigError) as exc:
        fail(f"replay refused: {exc}")
    except EvalError as exc:
        fail(f"replay stopped: {exc}")
    finally:
        progress.stop()
    report(out)
    cmp = compare(recording.snapshots, done.hashes, source=source, run_dir=out)
    typer.echo(f"replayed {done.steps} steps in {done.wall_s:.1f} s")
    if cmp.first_diff is None and (cmp.compared or not verify):
        typer.echo(
            f"snapshot hashes: all {len(cmp.compared)} versions compared equal the original's"
        )
        return
    if cmp.first_diff is None:
        typer.secho(
            f"error: {source} recorded no snapshot hash of a version replayed",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(1)
    delta = "unknown (a snapshot is no longer on disk)"
    if cmp.max_abs_delta is not None:
        delta = f"{cmp.max_abs_delta:.3g}"
    line = (
        f"snapshot hashes: version {cmp.first_diff} (after step {cmp.first_diff}) is the first "
        f"of {len(cmp.compared)} compared that differs from the original's; max |Δparam| "
        f"there = {delta}"
    )
    if verify:
        typer.secho(f"error: {line}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    typer.echo(line)
