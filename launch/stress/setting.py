"""One setting of a staleness sweep as real processes, and the row it ends as.

`make_runner(base, sweep)` gives launch/stress/run.py's `run_all` its `run_setting`: the setting's
config (`build_config`), the consumer and local producers on their devices (launch/local.py,
launch/placement.py) or the consumer alone waiting for external producers, the watcher that keeps
the snapshots to evaluate and stops an asynchronous run at the synchronous setting's wall-clock
(launch/stress/watch.py), then the row: launch/stress/results.py's numbers and the held-out scores
of consumer/evaluation/ (`score_model`). A setting that cannot finish (bad config, a process that
exits non-zero, every producer gone, an unreadable run) becomes a "failed" row with the reason;
Ctrl-C (the `stop` event) ends it cleanly and returns None.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import config as C
from common.errors import ConfigError
from common.files import run_files as RF
from launch.stress.plan import (
    RunSetting,
    Setting,
    Sweep,
    build_config,
    producer_args,
)
from launch.stress.results import failed

log = logging.getLogger(__name__)


def last_error(run_dir: Path) -> str:
    """The consumer's last error line (what a failed setting's row says), else where to look."""
    for name in (RF.CONSUMER_LOG, RF.CONSUMER_STDOUT_LOG):
        path = run_dir / name
        if path.exists():
            lines = [
                ln for ln in path.read_text(errors="replace").splitlines() if "error" in ln.lower()
            ]
            if lines:
                return lines[-1].strip()[-300:]
    return f"see the logs in {run_dir}"


def make_runner(base: C.Config, sweep: Sweep, *, live: bool) -> RunSetting:
    """`run_setting` for `run_all`: one setting as real processes (launch/local.py)."""
    from launch import local
    from launch.stress.results import measure
    from launch.stress.watch import SettingFailed, Watcher

    def run_setting(
        setting: Setting, run_dir: Path, t_sync: float | None, stop: threading.Event
    ) -> dict[str, Any] | None:
        sc = replace(sweep.scenario, seed=setting.seed)
        try:
            cfg = build_config(
                base,
                ms=setting.ms,
                is_mode=setting.is_mode,
                engine=sweep.engine,
                steps=sweep.steps,
                sc=sc,
                run_dir=run_dir,
                open_ended=t_sync is not None,
                wait_for=sweep.external or setting.producers,
                bind=sweep.bind,
                variant=setting.variant,
            )
            C.validate(cfg)
        except ConfigError as exc:
            return failed(str(exc))
        C.write(cfg, run_dir / RF.CONFIG)
        where = sweep.placements.get(setting.producers)

        def args(i: int) -> list[str]:
            return producer_args(i, sc) + (where.producer_sets(i) if where else [])

        watcher = Watcher(run_dir, steps=sweep.steps, t_sync_s=t_sync, until_s=t_sync)
        try:
            sup = local.Supervisor(
                run_dir,
                config_path=run_dir / RF.CONFIG,
                num_producers=0 if sweep.external else setting.producers,
                producer_args=args,
                consumer_env=where.consumer_env() if where else None,
                producer_env=where.producer_env if where else None,
            )
            beyond = (
                f"to match the synchronous setting's {t_sync:.1f} s of training" if t_sync else ""
            )
            wording = local.Wording(label=f"[{setting.describe()}]", beyond=beyond)
            code = local.run(
                sup, steps=sweep.steps, live=live, wording=wording, on_tick=watcher, stop_event=stop
            )
        except SettingFailed as exc:
            return failed(str(exc))
        if stop.is_set():
            return None
        if code != 0:
            return failed(f"exit code {code}: {last_error(run_dir)}")
        try:  # a setting's failure is recorded, and the sweep goes on
            watcher.poll()
            row = measure(
                run_dir, steps=sweep.steps, t_sync_s=t_sync, target_reward=sweep.target_reward
            )
            if row["steps"] < sweep.steps:
                return failed(f"the run ended after {row['steps']} of {sweep.steps} steps")
            if sweep.engine != "fake" and sweep.heldout:
                row |= heldout_columns(cfg, run_dir, watcher.captured, synchronous=t_sync is None)
        except (ConfigError, OSError, ValueError, KeyError, RuntimeError) as exc:
            log.exception("setting %s: reading or evaluating the run failed", setting.name)
            return failed(f"{type(exc).__name__}: {exc}")
        placed = where.describe() if where else f"{sweep.external} external producers"
        from launch.cores import usable_cores

        load = {"load_mean": watcher.load_mean, "cores": usable_cores()}
        return {
            **row,
            **load,
            "status": "ok",
            "error": "",
            "engine": sweep.engine_name,
            "placement": placed,
        }

    return run_setting


def heldout_columns(
    cfg: C.Config, run_dir: Path, captured: dict[str, int], *, synchronous: bool
) -> dict[str, Any]:
    """Held-out scores of the snapshots kept at equal steps and at equal wall-clock (the
    synchronous setting's own end is both)."""
    from consumer import evaluation
    from launch.stress.watch import AT_STEPS, AT_SYNC_TIME
    from producer.rewards.judge import HeldOutJudge

    if not evaluation.has_heldout(cfg):
        return {"heldout": ""}
    model_dir = Path(cfg.model.path)
    out: dict[str, Any] = {"heldout": evaluation.describe(cfg)}
    if AT_STEPS in captured:
        score = evaluation.score_model(cfg, model_dir, run_dir / AT_STEPS, judge=HeldOutJudge).score
        out |= {"final_accuracy": score, "final_version": captured[AT_STEPS]}
        if synchronous:
            out |= {"accuracy_at_equal_time": score, "equal_time_version": captured[AT_STEPS]}
    if not synchronous and AT_SYNC_TIME in captured:
        score = evaluation.score_model(
            cfg, model_dir, run_dir / AT_SYNC_TIME, judge=HeldOutJudge
        ).score
        out |= {"accuracy_at_equal_time": score, "equal_time_version": captured[AT_SYNC_TIME]}
    return out
