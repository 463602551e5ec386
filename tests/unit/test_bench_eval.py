"""bench/eval_during_training.py: its figures from the two runs' metrics lines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from step_records import BASE

from common.files.metrics import StepRecord

ROOT = Path(__file__).resolve().parents[2]


def bench():
    spec = importlib.util.spec_from_file_location(
        "eval_during_training", ROOT / "bench" / "eval_during_training.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def line(step: int, t: float, **extra) -> StepRecord:
    return StepRecord(**{**BASE, "step": step, "time_s": t, "unix_time": 1000.0 + t, **extra})


def test_the_time_to_the_target_is_compared_at_the_version_that_reached_it():
    off = [line(s, 2.0 * s) for s in range(1, 41)]
    on = [line(s, 2.0 * s, eval_rounds_skipped=0) for s in range(1, 41)]
    on[3] = line(4, 8.0, eval_version=0, eval_pass_at_1=0.2, eval_rounds_skipped=0)
    on[24] = line(25, 50.0, eval_version=20, eval_pass_at_1=0.6, eval_rounds_skipped=0)
    got = bench().figures(off, 990.0, on, 995.0, 0.55)
    assert got["version_at_target"] == 20
    assert got["on_s_to_target"] == pytest.approx(55.0)  # reported at step 25, from the start
    assert got["off_s_to_version"] == pytest.approx(50.0)  # step 20 of the run without eval
    assert got["on_over_off_to_target"] == pytest.approx(1.1)
    assert got["evaluated"] == [(0, 0.2), (20, 0.6)]
    assert got["off_s_per_step"] == pytest.approx(2.0)


def test_a_run_that_never_reaches_the_target_has_no_ratio():
    off = [line(s, float(s)) for s in range(1, 5)]
    on = [line(s, float(s), eval_rounds_skipped=1) for s in range(1, 5)]
    got = bench().figures(off, 0.0, on, 0.0, 0.55)
    assert got["on_over_off_to_target"] is None
    assert got["rounds_skipped"] == 1
