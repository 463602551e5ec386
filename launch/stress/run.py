"""A sweep's run: its settings one after another, what each ended as, and the sweep's outputs.

`run_sweep` checks `--out` (a directory holding another sweep is refused, `--resume` must repeat
the same sweep, `--force` starts afresh), runs the settings in order with
launch/stress/setting.py's runner (`run_all`), keeps each setting's row in
`runs/<setting>/result.json` as soon as it exists, and rewrites results.csv, summary.md and the
plots after every row (launch/stress/results.py, launch/stress/plots.py). `report_sweep` writes
them again from the result.json files alone (`asyncgrpo report SWEEP_DIR`).
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import config as C
from common.errors import ConfigError
from launch.stress.plan import RunSetting, Setting, Sweep

RESULT_FILE = "result.json"
SWEEP_FILE = "sweep.json"


def fingerprint(base: C.Config, sweep: Sweep) -> dict[str, Any]:
    """What must not change between a sweep and its `--resume` (the rows would not compare)."""
    return {
        "config": C.to_toml(base),
        "engine": sweep.engine,
        "steps": sweep.steps,
        "scenario": repr(sweep.scenario),
        "target_reward": sweep.target_reward,
        "external": sweep.external,
    }


# what a sweep writes into --out; `--force` removes these and nothing else
SWEEP_OUTPUTS = (SWEEP_FILE, "runs", "results.csv", "summary.md", "plots")


def check_resume(
    out: Path, base: C.Config, sweep: Sweep, *, resume: bool, force: bool = False
) -> None:
    """Refuse to mix two different sweeps in one directory (`ConfigError` saying why); with
    `force`, remove an earlier sweep's outputs (`SWEEP_OUTPUTS`) and start afresh."""
    if resume and force:
        raise ConfigError("--resume finishes the sweep in --out and --force deletes it: pass one")
    path = out / SWEEP_FILE
    if force:
        for name in SWEEP_OUTPUTS:
            gone = out / name
            if gone.is_dir() and not gone.is_symlink():
                shutil.rmtree(gone)
            elif gone.exists() or gone.is_symlink():
                gone.unlink()
    now = fingerprint(base, sweep)
    if not path.exists():
        if any((out / "runs").glob(f"*/{RESULT_FILE}")):
            raise ConfigError(
                f"{out} holds results of another sweep: pass --force to replace them, or "
                "choose another --out"
            )
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(now, indent=1))
        return
    if not resume:
        raise ConfigError(
            f"{out} already holds a sweep: pass --resume to finish it (finished settings are "
            "kept), or --force to start a new one there (deletes its results and runs), or "
            "choose another --out"
        )
    before = json.loads(path.read_text())
    changed = sorted(k for k in now if before.get(k) != now[k])
    if changed:
        raise ConfigError(
            f"--resume: this command differs from the sweep in {out} in {', '.join(changed)}; "
            "run it with the same config, engine, --steps and options, or choose another --out"
        )


def finished_row(run_dir: Path) -> dict[str, Any] | None:
    """The row a setting ended with, if it ended "ok"."""
    path = run_dir / RESULT_FILE
    if not path.exists():
        return None
    row: dict[str, Any] = json.loads(path.read_text())
    return row if row.get("status") == "ok" else None


def run_all(
    out: Path,
    todo: list[Setting],
    run_setting: RunSetting,
    *,
    resume: bool,
    on_row: Callable[[list[dict[str, Any]]], None] = lambda rows: None,
) -> tuple[list[dict[str, Any]], bool]:
    """Run `todo` in order with `run_setting(setting, run_dir, t_sync_s, stop)`, which returns
    the row, or None once `stop` is set (Ctrl-C). Returns (rows, interrupted).

    A setting whose synchronous baseline ended "ok" is given its `wall_s` as `t_sync_s`. Every
    row is written to the setting's result.json as soon as it exists, and `on_row` sees all
    rows so far (results.csv stays current)."""
    rows: dict[str, dict[str, Any]] = {}
    stop = threading.Event()
    try:
        for setting in todo:
            run_dir = out / "runs" / setting.name
            kept = finished_row(run_dir) if resume else None
            if kept is not None:
                rows[setting.name] = kept
                continue
            sync = rows.get(setting.sync().name)
            ok = setting.ms != 0 and sync is not None and sync["status"] == "ok"
            t_sync = sync["wall_s"] if ok and sync else None
            if run_dir.exists():
                shutil.rmtree(run_dir)  # an interrupted or failed earlier attempt
            run_dir.mkdir(parents=True)
            row = run_setting(setting, run_dir, t_sync, stop)
            if row is None:
                return list(rows.values()), True
            row = {
                "setting": setting.name,
                "max_staleness": setting.ms,
                "producers": setting.producers,
                "is_mode": setting.is_mode,
                "seed": setting.seed,
                "variant": setting.variant,
                **row,
            }
            tmp = run_dir / (RESULT_FILE + ".tmp")
            tmp.write_text(json.dumps(row, indent=1, default=str))
            tmp.rename(run_dir / RESULT_FILE)
            rows[setting.name] = row
            on_row(list(rows.values()))
    except KeyboardInterrupt:  # Ctrl-C between two settings (during one, `stop` is set)
        return list(rows.values()), True
    return list(rows.values()), False


def is_sweep(out: Path) -> bool:
    """`out` is a sweep's directory (it holds sweep.json), not one run's."""
    return (out / SWEEP_FILE).is_file()


def read_rows(out: Path) -> list[dict[str, Any]]:
    """The row of every setting of the sweep in `out` that ended (ok or failed), in the order a
    sweep runs them (per seed, producers and IS mode, each synchronous baseline first)."""
    rows = [json.loads(p.read_text()) for p in (out / "runs").glob(f"*/{RESULT_FILE}")]
    order = ("seed", "variant", "producers", "is_mode")
    default = {"variant": "config"}  # rows of sweeps from before variants
    return sorted(
        rows,
        key=lambda r: (*(r.get(k, default.get(k)) for k in order), r.get("max_staleness", 0)),
    )


def report_sweep(out: Path) -> list[Path]:
    """results.csv, summary.md and the plots of the sweep in `out`, from its settings'
    result.json files; `ConfigError` when no setting has ended yet."""
    rows = read_rows(out)
    if not rows:
        raise ConfigError(
            f"{out} is a stress sweep with no finished setting yet (no runs/*/{RESULT_FILE})"
        )
    return write_outputs(out, rows, [])


def write_outputs(out: Path, rows: list[dict[str, Any]], notes: list[str]) -> list[Path]:
    """results.csv, summary.md and the plots of the rows so far."""
    from launch.stress.plots import plot_all
    from launch.stress.results import add_speedups, summary, write_csv

    add_speedups(rows)
    write_csv(out / "results.csv", rows)
    plots = plot_all(out, rows)
    (out / "summary.md").write_text(summary(rows, plots, notes))
    return [out / "results.csv", out / "summary.md", *plots]


def run_sweep(
    base: C.Config,
    out: Path,
    todo: list[Setting],
    sweep: Sweep,
    *,
    resume: bool = False,
    force: bool = False,
    live: bool = False,
    notes: list[str] = (),  # type: ignore[assignment]
) -> tuple[list[dict[str, Any]], bool]:
    """Run the settings (see the module docstring); (rows, interrupted by Ctrl-C)."""
    check_resume(out, base, sweep, resume=resume, force=force)

    def on_row(rows: list[dict[str, Any]]) -> None:
        write_outputs(out, rows, list(notes))

    from launch.stress.setting import make_runner

    rows, interrupted = run_all(
        out, todo, make_runner(base, sweep, live=live), resume=resume, on_row=on_row
    )
    write_outputs(out, rows, list(notes))
    return rows, interrupted
