"""Whether a new run may use a run directory: a directory that already holds a run is refused,
unless the user says `--resume` (continue it) or `--force` (start afresh there).

A run directory "holds a run" when any file a consumer writes during a run is there (metrics,
leases, ledger, snapshots, checkpoints, the recorded stream; `PREVIOUS_RUN`); a `config.toml`
or a log alone does not count (the launcher writes a config before it starts the consumer; a
consumer that failed at start-up leaves a log). Without this check a second run appended its
metrics and leases to the first one's and overwrote its snapshots: two runs mixed into one,
silently. `--force` deletes those files and the run's other outputs (logs, plots, summary),
nothing else.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from common.errors import ConfigError
from common.files import run_files as RF

# what a run writes into its run directory and leaves behind; any of these means "a run was here"
PREVIOUS_RUN = (
    RF.METRICS,
    RF.LEASES,
    RF.LEDGER,
    RF.SNAPSHOTS,
    RF.CHECKPOINTS,
    RF.LEGACY_CHECKPOINT,
    RF.STREAM,
)
# what `--force` removes besides them: a run's other outputs (config.toml is rewritten anyway)
_ALSO_REMOVED = (RF.FINAL, RF.ENDPOINTS, RF.CONSUMER, RF.EVAL, RF.SUMMARY, RF.PLOTS, RF.PROCESSES)


def previous_run(run_dir: Path) -> list[str]:
    """The files and directories of an earlier run in `run_dir` (names, in `PREVIOUS_RUN` order)."""
    return [name for name in PREVIOUS_RUN if (run_dir / name).exists()]


def claim(run_dir: Path, *, resume: bool, force: bool, resumable: bool = True) -> Path:
    """Create `run_dir` for a new run, or check it for `--resume`; `ConfigError` when it holds
    another run and neither flag was given. `force` removes the earlier run's files first;
    `resumable` False: the command has no --resume (a replay), so the error does not offer it."""
    if resume and force:
        raise ConfigError(
            "--resume continues the run in the directory and --force deletes it: pass one of them"
        )
    if resume:
        if not run_dir.is_dir():
            raise ConfigError(
                f"run.resume: {run_dir} does not exist (pass --run-dir of the run to resume)"
            )
        return run_dir
    found = previous_run(run_dir)
    if found and not force:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        resume_hint = "pass --resume to continue it, or " if resumable else "pass "
        raise ConfigError(
            f"{run_dir} already holds a run ({shown}): {resume_hint}--force to start a new run "
            "there (deletes those files), or choose another --run-dir"
        )
    logs = [p.name for p in run_dir.glob("*.log")] if found else []
    for name in [*found, *_ALSO_REMOVED, *logs] if found else ():
        path = run_dir / name
        if not path.exists() and not path.is_symlink():
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir
