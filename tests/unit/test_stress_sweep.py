"""The staleness sweep's pure parts: GPU placement, setting order, the run loop's bookkeeping
(failures, Ctrl-C, --resume), and the equal-wall-clock and target-reward readings."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from common import config as C
from common.errors import ConfigError
from common.files import run_files as RF
from launch.placement import plan
from launch.stress.plan import Setting, Sweep, settings
from launch.stress.results import first_reaching, reward_at
from launch.stress.run import check_resume, run_all

# -- placement -------------------------------------------------------------------------------


def test_without_a_gpu_everything_runs_on_the_cpu_and_children_see_no_gpu():
    p = plan(num_gpus=0, engine="hf", producers=3)
    assert p.num_producers == 3
    assert p.describe() == "learner cpu; p1 cpu; p2 cpu; p3 cpu"
    assert p.consumer_env() == {"CUDA_VISIBLE_DEVICES": ""}
    assert p.producer_env(2) == {"CUDA_VISIBLE_DEVICES": ""}
    assert p.producer_sets(0) == []


def test_one_gpu_colocates_one_vllm_producer_with_the_learner_at_the_colocated_share():
    p = plan(num_gpus=1, engine="vllm", producers=None, colocated_memory=0.35)
    assert (p.learner_gpus, p.producer_gpus) == ((0,), (0,))
    assert p.producer_sets(0) == ["--set", "vllm.gpu_memory_utilization=0.350"]
    assert p.describe() == "learner gpu0; p1 gpu0 (vllm 0.35)"


def test_by_default_the_learner_takes_gpu0_and_every_other_gpu_gets_one_producer():
    p = plan(num_gpus=4, engine="vllm", producers=None)
    assert (p.learner_gpus, p.producer_gpus) == ((0,), (1, 2, 3))
    assert p.vllm_memory == (0.9, 0.9, 0.9)


def test_explicit_gpus_override_the_rule_and_a_gpu_listed_twice_is_split():
    p = plan(num_gpus=4, engine="vllm", producers=None, learner_gpus=[3], producer_gpus=[0, 0, 3])
    assert (p.learner_gpus, p.producer_gpus) == ((3,), (0, 0, 3))
    assert p.vllm_memory == (0.45, 0.45, 0.4)
    hf = plan(num_gpus=4, engine="hf", producers=None, producer_gpus=[0, 1])
    assert (hf.learner_gpus, hf.vllm_memory) == ((2,), (None, None))


def test_indices_map_to_the_gpus_this_process_was_given():
    p = plan(num_gpus=2, engine="hf", producers=None, visible=("4", "6"))
    assert p.consumer_env() == {"CUDA_VISIBLE_DEVICES": "4"}
    assert p.producer_env(0) == {"CUDA_VISIBLE_DEVICES": "6"}
    assert p.describe() == "learner gpu0; p1 gpu1"  # indices as the user typed them


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_gpus": 2, "learner_gpus": [2]}, "--learner-gpus: GPU 2 does not exist"),
        ({"num_gpus": 4, "learner_gpus": [0, 1]}, "give exactly one GPU"),
        ({"num_gpus": 4, "producers": 2}, "one producer per producer GPU"),
        ({"num_gpus": 0, "producer_gpus": [0]}, "no CUDA GPU is visible"),
        ({"num_gpus": 0, "engine": "vllm"}, "--engine vllm needs a CUDA GPU"),
        ({"num_gpus": 1, "colocated_memory": 1.0}, "--colocated-memory must be in (0, 1)"),
    ],
)
def test_what_cannot_be_placed_is_refused_with_the_flag_to_change(kwargs, message):
    args: dict[str, Any] = {"engine": "hf", "producers": None} | kwargs
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan(**args)


# -- settings and the run loop ----------------------------------------------------------------


def test_each_synchronous_baseline_runs_before_the_settings_compared_with_it():
    todo = settings([2, 0, 1], [2], ["off"], [0, 1])
    assert [s.name for s in todo] == [
        "ms0-p2-off-s0", "ms2-p2-off-s0", "ms1-p2-off-s0",
        "ms0-p2-off-s1", "ms2-p2-off-s1", "ms1-p2-off-s1",
    ]  # fmt: skip


class FakeRunner:
    """Stands in for the processes: a row per setting, a failure or a Ctrl-C where told."""

    def __init__(self, *, fail: set[str] = frozenset(), interrupt: str = "") -> None:
        self.fail, self.interrupt = fail, interrupt
        self.calls: list[tuple[str, float | None]] = []

    def __call__(
        self, setting: Setting, run_dir: Path, t_sync: float | None, stop: threading.Event
    ) -> dict[str, Any] | None:
        self.calls.append((setting.name, t_sync))
        assert run_dir.is_dir()
        assert not any(run_dir.iterdir()), "a fresh run directory"
        (run_dir / RF.METRICS).write_text("")
        if setting.name == self.interrupt:
            stop.set()
            return None
        if setting.name in self.fail:
            return {"status": "failed", "error": "exit code 1: boom"}
        return {"status": "ok", "error": "", "wall_s": 10.0 + setting.ms}


def test_a_failed_setting_is_recorded_and_the_sweep_goes_on(tmp_path):
    runner = FakeRunner(fail={"ms0-p2-off-s0"})
    rows, interrupted = run_all(
        tmp_path, settings([0, 2], [2], ["off"], [0, 1]), runner, resume=False
    )
    assert not interrupted
    assert [(r["setting"], r["status"]) for r in rows] == [
        ("ms0-p2-off-s0", "failed"), ("ms2-p2-off-s0", "ok"),
        ("ms0-p2-off-s1", "ok"), ("ms2-p2-off-s1", "ok"),
    ]  # fmt: skip
    # equal wall-clock: only against a synchronous run that finished, of the same seed
    assert runner.calls == [
        ("ms0-p2-off-s0", None), ("ms2-p2-off-s0", None),
        ("ms0-p2-off-s1", None), ("ms2-p2-off-s1", 10.0),
    ]  # fmt: skip
    saved = json.loads((tmp_path / "runs" / "ms0-p2-off-s0" / "result.json").read_text())
    assert saved["error"] == "exit code 1: boom"
    assert (saved["seed"], saved["max_staleness"]) == (0, 0)


def test_ctrl_c_keeps_finished_settings_and_resume_runs_only_the_rest(tmp_path):
    todo = settings([0, 1, 2], [2], ["off"], [0])
    first = FakeRunner(fail={"ms1-p2-off-s0"}, interrupt="ms2-p2-off-s0")
    rows, interrupted = run_all(tmp_path, todo, first, resume=False)
    assert interrupted
    assert [r["setting"] for r in rows] == ["ms0-p2-off-s0", "ms1-p2-off-s0"]
    assert not (tmp_path / "runs" / "ms2-p2-off-s0" / "result.json").exists()
    kept = (tmp_path / "runs" / "ms0-p2-off-s0" / RF.METRICS).stat().st_mtime_ns

    second = FakeRunner()
    rows, interrupted = run_all(tmp_path, todo, second, resume=True)
    assert not interrupted
    # the finished one is skipped; the failed and the interrupted ones start again from scratch
    assert second.calls == [("ms1-p2-off-s0", 10.0), ("ms2-p2-off-s0", 10.0)]
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]
    assert (tmp_path / "runs" / "ms0-p2-off-s0" / RF.METRICS).stat().st_mtime_ns == kept


def test_a_sweep_directory_is_resumed_only_by_the_same_sweep(tmp_path):
    base, sweep = C.Config(), Sweep(engine="fake", steps=8)
    check_resume(tmp_path, base, sweep, resume=False)
    with pytest.raises(ConfigError, match="already holds a sweep: pass --resume"):
        check_resume(tmp_path, base, sweep, resume=False)
    check_resume(tmp_path, base, sweep, resume=True)
    with pytest.raises(ConfigError, match=r"differs from the sweep .* in config, steps"):
        check_resume(
            tmp_path, C.override(base, {"train.lr": 1e-3}), Sweep(engine="fake", steps=9),
            resume=True,
        )  # fmt: skip


# -- equal wall-clock and the target reward ---------------------------------------------------

CURVE = [(1.0, 1, 0.2), (2.0, 2, 0.4), (3.0, 3, 0.6), (4.0, 4, 0.5)]  # (time, step, reward)


def test_reward_at_equal_wall_clock_is_that_of_the_last_step_ended_by_then():
    assert reward_at(CURVE, 2.5) == 0.4
    assert reward_at(CURVE, 3.0) == 0.6
    assert reward_at(CURVE, 0.5) is None


def test_the_target_is_reached_at_the_first_step_at_or_above_it():
    assert first_reaching(CURVE, 0.5) == (3.0, 3)
    assert first_reaching(CURVE, 0.4) == (2.0, 2)
    assert first_reaching(CURVE, 0.7) is None
    assert first_reaching(CURVE, None) is None


def test_force_replaces_an_earlier_sweep_and_touches_nothing_else(tmp_path):
    base, sweep = C.Config(), Sweep(engine="fake", steps=8)
    check_resume(tmp_path, base, sweep, resume=False)
    (tmp_path / "runs" / "ms0-p2-off-s0").mkdir(parents=True)
    (tmp_path / "runs" / "ms0-p2-off-s0" / "result.json").write_text("{}")
    (tmp_path / "results.csv").write_text("old")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="pass one"):
        check_resume(tmp_path, base, sweep, resume=True, force=True)
    other = Sweep(engine="fake", steps=9)  # a different sweep: --resume would refuse it
    check_resume(tmp_path, base, other, resume=False, force=True)
    assert not (tmp_path / "runs").exists()
    assert not (tmp_path / "results.csv").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"
    check_resume(tmp_path, base, other, resume=True)  # the new sweep is the one recorded


def test_the_fake_engines_timings_are_config_keys_the_user_may_give():
    from launch.stress.plan import FAKE_DEFAULTS, with_fake_defaults

    base = with_fake_defaults(C.Config(), frozenset())
    assert (base.train.simulate_step_s, base.fake.latency_s, base.producer.max_in_flight) == (
        0.5, 0.5, 8,
    )  # fmt: skip
    given = C.apply_overrides(C.Config(), ["fake.latency_s=0.05"])
    mine = with_fake_defaults(given, frozenset({"fake.latency_s"}))
    assert (mine.fake.latency_s, mine.train.simulate_step_s) == (0.05, 0.5)
    from typer.testing import CliRunner

    from launch.cli import app

    shown = CliRunner().invoke(app, ["stress", "--help"], env={"COLUMNS": "200"}).output
    for key in FAKE_DEFAULTS:  # carried by --set like any key, not options of their own
        assert f"--{key.split('.')[1].replace('_', '-')}" not in shown
    for gone in ("--gen-s", "--step-s", "--jitter", "--long-tail", "--publish-delay-s"):
        assert gone not in shown


def test_a_demo_sweep_is_recorded_as_demo_though_it_runs_the_hf_engine():
    from launch.cli.stress import _modes_and_engine

    _, kind = _modes_and_engine("off", "demo")
    assert kind == "hf"
    sweep = Sweep(engine=kind, steps=8, named="demo")
    assert (sweep.engine, sweep.engine_name) == ("hf", "demo")
    assert Sweep(engine="hf", steps=8).engine_name == "hf"


def test_the_summary_table_gives_every_share_in_percent():
    from launch.stress.results import row_line, summary

    row = {
        "setting": "ms0-p2-off-s0",
        "status": "ok",
        "max_staleness": 0,
        "producers": 2,
        "is_mode": "off",
        "seed": 0,
        "steps_per_hour": 14300.0,
        "speedup_vs_sync": 1.0,
        "learner_idle_frac": 0.73,
        "final_accuracy": 0.675,
        "accuracy_at_equal_time": 0.675,
        "final_reward": 0.3,
        "reward_at_equal_time": 0.3,
    }
    table = summary([row], [], [])
    assert "| learner idle (%) |" in table
    assert "| held-out (equal steps, %) | held-out at sync wall-clock (%) |" in table
    assert "| 1.00 | 73 | – | 0.3 | 0.3 | – | 67.5 | 67.5 |" in table
    assert "learner idle  73%" in row_line(row)
