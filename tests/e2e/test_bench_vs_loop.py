"""bench/vs_loop.py: its figures from per-step records, and a short real run of every side."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vs_loop", ROOT / "bench" / "vs_loop.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_figures_come_from_the_step_records_and_the_command_start():
    vs_loop = bench_module()
    t0 = 1000.0
    records = [{"step": 1, "unix_time": 1010.0}, {"step": 2, "unix_time": 1011.0, "other": 1}]
    records[1] |= {"round_trip_s": 0.03, "gen_s": 0.02}
    records += [{"step": 3, "unix_time": 1012.0, "heldout_accuracy": 0.5, "round_trip_s": 0.05}]
    records += [{"step": 4, "unix_time": 1013.0, "heldout_accuracy": 0.56}]
    records += [{"step": 5, "unix_time": 1014.0, "heldout_accuracy": 0.54}]
    got = vs_loop.figures(records, t0, 1020.0, 0.55)
    assert got["s_per_step"] == pytest.approx(1.0)
    assert got["first_step_s"] == pytest.approx(10.0)
    assert got["t55_s"] == pytest.approx(13.0)  # the first evaluation at or above the threshold
    assert got["final_acc"] == 0.54
    assert got["command_s"] == pytest.approx(20.0)
    assert got["round_trip_s"] == pytest.approx(0.04)  # the median of the steps that have one
    assert got["gen_s"] == pytest.approx(0.02)
    assert vs_loop.figures(records, t0, 1020.0, 0.6)["t55_s"] is None


def test_ratios_and_medians_treat_a_threshold_never_reached_as_infinite():
    vs_loop = bench_module()
    assert vs_loop.median([1.0, None, 3.0]) == 3.0
    assert vs_loop.median([None, None, 3.0]) is None
    runs = [
        {"kind": "loop", "s_per_step": 0.1, "first_step_s": 2, "t55_s": 10.0, "final_acc": 0.6,
         "command_s": 20},
        {"kind": "async", "s_per_step": 0.08, "first_step_s": 5, "t55_s": None, "final_acc": 0.5,
         "command_s": 30},
    ]  # fmt: skip
    res = vs_loop.summarise(runs)
    assert res["async_over_loop_step"] == pytest.approx(0.8)
    assert res["async_over_loop_t55"] is None
    assert res["sync_s_per_step"] is None
    assert res["sync_over_loop_step"] is None
    assert res["sync_round_trip_beyond_gen_ms"] is None
    runs[0]["gen_s"] = 0.02
    runs.append({"kind": "sync", "round_trip_s": 0.035})
    assert vs_loop.summarise(runs)["sync_round_trip_beyond_gen_ms"] == pytest.approx(15.0)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_short_run_of_every_side_writes_the_stable_keys(tmp_path: Path):
    out = tmp_path / "vs_loop.json"
    cmd = [sys.executable, str(ROOT / "bench" / "vs_loop.py"), "--steps", "10", "--json", str(out)]
    cmd += ["--keep", str(tmp_path / "runs"), "--threshold", "0.0"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=850)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    res = json.loads(out.read_text())
    has_trl = importlib.util.find_spec("trl") is not None
    for kind in ("loop", "async", "sync") + (("trl",) if has_trl else ()):
        assert res[f"{kind}_s_per_step"] > 0
        assert res[f"{kind}_first_step_s"] > 0
        assert 0 < res[f"{kind}_t55_s"] <= res[f"{kind}_command_s"]  # threshold 0: first eval
        assert 0 <= res[f"{kind}_final_acc"] <= 1
        assert res[f"{kind}_cpu_s"] > 1  # the command's processes, its children included
    for key in ("async_over_loop_step", "sync_over_loop_step", "async_over_loop_t55"):
        assert res[key] > 0
    assert (res["trl_s_per_step"] is not None) == has_trl
    assert res["sync_round_trip_s"] > 0
    assert res["loop_gen_s"] > 0
    assert [r["steps"] for r in res["runs"]] == [10] * len(res["runs"])


def test_startup_phases_come_from_the_first_matching_log_line_of_any_process(tmp_path: Path):
    vs_loop = bench_module()
    (tmp_path / "consumer.log").write_text(
        "2026-11-23 18:07:14,746 consumer INFO learner attention: padded\n"
        "2026-11-23 18:07:15,250 consumer INFO consumer x listening on tcp://127.0.0.1:1 (run d)\n"
    )
    (tmp_path / "producer-p1.log").write_text(
        "2026-11-23 18:07:16,000 producer INFO registered as p1 with consumer run x\n"
        "2026-11-23 18:07:18,500 producer INFO loaded weights v0\n"
    )
    (tmp_path / "producer-p2.log").write_text(
        "2026-11-23 18:07:15,900 producer INFO registered as p2 with consumer run x\n"
    )
    t0 = time.mktime(time.strptime("2026-11-23 18:07:10", "%Y-%m-%d %H:%M:%S"))
    got = vs_loop.startup_phases(tmp_path, t0)
    assert got["consumer_listening_s"] == pytest.approx(5.25)
    assert got["producer_registered_s"] == pytest.approx(5.9)  # the first of the producers
    assert got["producer_weights_s"] == pytest.approx(8.5)
