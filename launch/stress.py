"""`asyncgrpo stress`: a grid of real pipeline runs under different staleness settings.

Every setting is a full run (consumer + producers as processes over ZeroMQ, launch/local.py) in
`OUT/runs/<setting>/`, on the user's own config (model, task, rewards, loss) with only what the
setting varies overridden: `staleness.max_staleness`, the importance correction, `run.seed`, and
the number of producers. This module builds the settings, runs them one after another and keeps
what each one ended as; the numbers come from the runs' files (launch/stress_results.py).

Settings: every (seed, producers, IS mode, max_staleness), the `max_staleness = 0` setting of
each (seed, producers, IS mode) first: it is the synchronous baseline whose wall-clock time to
`--steps` is the "equal wall-clock" point of the others. An asynchronous setting then runs until
it has taken `--steps` steps AND run that long (launch/stress_watch.py stops it), so its reward
(and held-out score) can be read both at equal steps and at equal wall-clock.

Engines: `fake` measures scheduling and transport only (simulated learner step of `step_s`, fake
generation of `gen_s` per group, seeded coin rewards); `hf` and `vllm` train the config's model
(`demo` = `hf` on launch/configs/demo.toml unless a config is given). Held-out scores come from
launch/heldout.py when the config has a held-out split, reward curves otherwise.

Where the processes run: local producers on the devices of launch/placement.py (recorded in
results.csv), or `external` producers the user started elsewhere with `asyncgrpo producer
--follow --connect ADDR`: each setting's consumer then binds a fixed address and waits for all of
them (`run.wait_for_producers`) before it grants a lease or starts its clock.

Ending: every setting leaves `runs/<setting>/result.json` (its results.csv row, "ok" or "failed"
with the error: the sweep goes on after a failure). Ctrl-C stops the setting in progress cleanly
and ends the sweep; `--resume` re-runs the same command, skipping every setting that ended "ok"
(a setting that failed or was interrupted starts again from scratch).
"""

from __future__ import annotations

import itertools
import json
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from common import config as C
from common.errors import ConfigError
from launch.placement import Placement

RESULT_FILE = "result.json"
SWEEP_FILE = "sweep.json"
# "off", then every TIS level-mode pair of the config ("token-truncate", ...).
IS_MODES = (
    "off",
    *(f"{level}-{mode}" for level in get_args(C.TISLevel) for mode in get_args(C.TISMode)),
)


@dataclass(frozen=True)
class Scenario:
    """Heterogeneity injected into every setting of a sweep."""

    gen_s: float = 0.5  # fake engine: seconds per group
    step_s: float = 0.5  # fake engine: simulated learner step
    slow_factor: float = 1.0  # producer p1 generates this many times slower
    jitter: float = 0.0
    long_tail: float = 0.0
    stall_s: float = 0.0  # producer p2 stalls this long after stall_after_s
    stall_after_s: float = 5.0
    publish_delay_s: float = 0.0
    max_in_flight: int = 8  # leases a producer may hold (the staleness bound still caps them)
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Setting:
    """One run of the sweep."""

    ms: int  # staleness.max_staleness
    producers: int
    is_mode: str  # an IS_MODES entry
    seed: int

    @property
    def name(self) -> str:
        return f"ms{self.ms}-p{self.producers}-{self.is_mode}-s{self.seed}"

    def sync(self) -> Setting:
        """The synchronous setting this one is compared with at equal wall-clock."""
        return Setting(0, self.producers, self.is_mode, self.seed)


@dataclass(frozen=True)
class Sweep:
    """What is the same for every setting of one sweep."""

    engine: str  # fake, hf or vllm
    steps: int  # optimizer steps per setting (equal steps)
    scenario: Scenario = field(default_factory=Scenario)
    target_reward: float | None = None
    external: int = 0  # producers started elsewhere (0 = local producers)
    bind: str = ""  # external: host:port every setting's consumer binds
    placements: dict[int, Placement] = field(default_factory=dict)  # local: by producer count
    heldout: bool = True  # score snapshots on the held-out split (when the config has one)
    given: frozenset[str] = frozenset()  # keys the user set (kept over the cores rule)


def settings(
    staleness: list[int], producers: list[int], is_modes: list[str], seeds: list[int]
) -> list[Setting]:
    """Every combination, each synchronous baseline before the settings compared with it."""
    ordered = sorted(dict.fromkeys(staleness), key=lambda ms: ms != 0)
    return [
        Setting(ms, n, mode, seed)
        for seed, n, mode, ms in itertools.product(seeds, producers, is_modes, ordered)
    ]


def is_label(cfg: C.Config) -> str:
    """The IS mode a config already has ("off", "token-truncate", ...)."""
    return f"{cfg.loss.tis_level}-{cfg.loss.tis_mode}" if cfg.loss.tis else "off"


def is_overrides(is_mode: str) -> dict[str, object]:
    if is_mode == "off":
        return {"loss.tis": False}
    level, mode = is_mode.split("-")
    return {"loss.tis": True, "loss.tis_level": level, "loss.tis_mode": mode}


def build_config(
    base: C.Config,
    *,
    ms: int,
    is_mode: str,
    engine: str,
    steps: int,
    sc: Scenario,
    run_dir: Path,
    open_ended: bool = False,
    wait_for: int = 0,
    bind: str = "",
    threads: dict[str, int] | None = None,
) -> C.Config:
    """One setting's config. `open_ended`: no step limit (the sweep stops the run once it has
    taken `steps` steps and run as long as the synchronous setting); `wait_for`: producers the
    consumer waits for before its first lease; `bind`: a fixed host:port (external producers);
    `threads`: torch thread counts (`threads_for`)."""
    values: dict[str, object] = {
        "staleness.max_staleness": ms, "run.steps": 0 if open_ended else steps,
        "run.seed": sc.seed, "run.dir": run_dir, "run.resume": False, "net.control_port": 0,
        "run.wait_for_producers": wait_for, "snapshot.delay_s": sc.publish_delay_s,
        "producer.engine": engine, **is_overrides(is_mode), **(threads or {}),
    }  # fmt: skip
    if base.staleness.publish_every > ms + 1:
        values["staleness.publish_every"] = ms + 1  # the tightest bound the config allows
    if engine == "fake":
        values |= {
            "train.simulate_step_s": sc.step_s, "producer.max_in_flight": sc.max_in_flight,
            "fake.latency_s": sc.gen_s, "fake.jitter": sc.jitter, "fake.long_tail": sc.long_tail,
        }  # fmt: skip
    if bind:
        host, _, port = bind.removeprefix("tcp://").rpartition(":")
        values |= {"net.bind_host": host, "net.control_port": int(port)}
    return C.override(base, values)


def threads_for(base: C.Config, sweep: Sweep, setting: Setting) -> dict[str, int]:
    """hf engine: the learner's and producers' torch threads by the cores rule
    (launch/cores.py) for the setting's producer count, except the keys the user set."""
    if sweep.engine != "hf":
        return {}
    from launch import cores

    split = cores.plan(
        cores.usable_cores(), max_staleness=setting.ms,
        prompts_per_step=base.train.prompts_per_step, producers=setting.producers,
    )  # fmt: skip
    rule = {
        "model.torch_threads": split.learner_threads,
        "producer.torch_threads": split.producer_threads,
    }
    return {k: v for k, v in rule.items() if k not in sweep.given}


def producer_args(index: int, sc: Scenario) -> list[str]:
    """Per-producer injections: p1 is the slow one, p2 the one that stalls."""
    args: list[str] = []
    if index == 0 and sc.slow_factor != 1.0:
        args += ["--set", f"producer.slow_factor={sc.slow_factor}"]
    if index == 1 and sc.stall_s > 0:
        args += [
            "--set",
            f"producer.stall_s={sc.stall_s}",
            "--set",
            f"producer.stall_after_s={sc.stall_after_s}",
        ]
    return args


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


def check_settings(base: C.Config, sweep: Sweep, todo: list[Setting]) -> None:
    """Every setting's config is valid (a `ConfigError` naming the first that is not), before
    anything starts."""
    if not todo:
        raise ConfigError("no setting to run: give --max-staleness, --seeds and --producers")
    if sweep.steps < 1:
        raise ConfigError("--steps must be >= 1")
    if sweep.external:
        host, _, port = sweep.bind.removeprefix("tcp://").rpartition(":")
        if not host or not port.isdigit() or int(port) == 0:
            raise ConfigError(f"--bind: expected HOST:PORT with a fixed port, got {sweep.bind!r}")
    for s in todo:
        try:
            C.validate(
                build_config(
                    base, ms=s.ms, is_mode=s.is_mode, engine=sweep.engine, steps=sweep.steps,
                    sc=sweep.scenario, run_dir=Path("."), bind=sweep.bind,
                    threads=threads_for(base, sweep, s),
                )
            )  # fmt: skip
        except ConfigError as exc:
            raise ConfigError(f"setting {s.name}: {exc}") from None


def row_line(r: dict[str, Any]) -> str:
    """One line per setting for the terminal."""
    if r["status"] != "ok":
        return f"{r['setting']:<32} FAILED: {r['error']}"
    sph, speedup = r.get("steps_per_hour") or 0, r.get("speedup_vs_sync") or 0
    reward = r.get("reward_at_equal_time")
    return (
        f"{r['setting']:<32} steps/h {sph:9.0f}  speedup {speedup:5.2f}x  "
        f"learner idle {r.get('learner_idle_frac') or 0:.2f}  "
        f"staleness max {r.get('staleness_max_trained')}  "
        f"reward at sync time {'-' if reward is None else format(reward, '.3f')}"
    )


def finished_row(run_dir: Path) -> dict[str, Any] | None:
    """The row a setting ended with, if it ended "ok"."""
    path = run_dir / RESULT_FILE
    if not path.exists():
        return None
    row: dict[str, Any] = json.loads(path.read_text())
    return row if row.get("status") == "ok" else None


RunSetting = Callable[[Setting, Path, "float | None", threading.Event], "dict[str, Any] | None"]


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
            row = {"setting": setting.name, "max_staleness": setting.ms,
                   "producers": setting.producers, "is_mode": setting.is_mode,
                   "seed": setting.seed, **row}  # fmt: skip
            tmp = run_dir / (RESULT_FILE + ".tmp")
            tmp.write_text(json.dumps(row, indent=1, default=str))
            tmp.rename(run_dir / RESULT_FILE)
            rows[setting.name] = row
            on_row(list(rows.values()))
    except KeyboardInterrupt:  # Ctrl-C between two settings (during one, `stop` is set)
        return list(rows.values()), True
    return list(rows.values()), False


def failed(error: str) -> dict[str, Any]:
    return {"status": "failed", "error": error}


def write_outputs(out: Path, rows: list[dict[str, Any]], notes: list[str]) -> list[Path]:
    """results.csv, summary.md and the plots of the rows so far."""
    from launch.stress_plots import plot_all
    from launch.stress_results import add_speedups, summary, write_csv

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

    from launch.stress_setting import make_runner

    rows, interrupted = run_all(
        out, todo, make_runner(base, sweep, live=live), resume=resume, on_row=on_row
    )
    write_outputs(out, rows, list(notes))
    return rows, interrupted
