"""Truncated sampling through the CLI: `asyncgrpo launch --set sampling.top_k=...` trains on the
kept sets (fake engine, tiny model; the demo with top_p 0.9 in the slow run), and `asyncgrpo
stress ... --set sampling.top_k=20` runs a sweep whose groups all carry their kept sets."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from procs import cli, read_jsonl, stop


def _balanced(run_dir: Path) -> dict:
    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert ledger["balance"]["ok"] == 1
    assert ledger["balance"]["rejected_invalid"] == 0
    assert ledger["balance"]["open"] == 0
    return ledger


def _finish(proc, log: Path, timeout_s: float) -> int:
    try:
        return proc.wait(timeout_s)
    finally:
        stop(proc)


@pytest.mark.timeout(300)
def test_a_launch_with_top_k_trains_every_token_on_its_kept_set(tmp_path, tiny_model_dir):
    run_dir, log = tmp_path / "run", tmp_path / "launch.log"
    launcher = cli(
        "launch", "--run-dir", str(run_dir), "--steps", "4", "--no-live", "--no-eval",
        "--engine", "fake", "--set", f"model.path={tiny_model_dir}",
        "--set", "sampling.group_size=4", "--set", "train.prompts_per_step=4",
        "--set", "eval.learner_every_steps=0", "--set", "sampling.top_k=20", log=log,
    )  # fmt: skip
    assert _finish(launcher, log, 240) == 0, log.read_text()[-3000:]
    ledger = _balanced(run_dir)
    assert ledger["balance"]["trained"] == 4 * 4
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert len(steps) == 4
    for m in steps:
        assert m["kept_size_mean"] == 20.0  # the fake engine keeps exactly top_k ids
        assert 0 < m["kept_mass_mean"] < 1
        assert m["tokens_kept_unknown"] == 0
        assert 0 <= m["ratio_out_of_band"] <= 1
        assert m["rejected_messages"] == 0


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_a_stress_sweep_with_top_k_20_runs_and_carries_the_kept_sets(tmp_path):
    out, log = tmp_path / "sweep", tmp_path / "stress.log"
    sweep = cli(
        "stress", "--out", str(out), "--max-staleness", "0,1", "--steps", "5",
        "--set", "fake.latency_s=0.05", "--set", "train.simulate_step_s=0.05",
        "--set", "sampling.group_size=4",
        "--set", "train.prompts_per_step=4", "--set", "sampling.top_k=20", log=log,
    )  # fmt: skip
    assert _finish(sweep, log, 420) == 0, log.read_text()[-3000:]
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["max_staleness"] for r in rows] == ["0", "1"]
    for row in rows:
        assert row["status"] == "ok", row["error"]
        run_dir = out / "runs" / row["setting"]
        _balanced(run_dir)
        assert int(row["steps"]) == 5
        config = (run_dir / "config.toml").read_text()
        assert "top_k = 20" in config


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_demo_launch_with_top_p_0_9_learns_with_ratios_at_one(tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "launch.log"
    launcher = cli(
        "launch", "--run-dir", str(run_dir), "--steps", "60", "--no-live",
        "--set", "sampling.top_p=0.9", "--set", "staleness.max_staleness=0", log=log,
    )  # fmt: skip
    assert _finish(launcher, log, 800) == 0, log.read_text()[-3000:]
    _balanced(run_dir)
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert len(steps) == 60
    assert all(m["tokens_kept_unknown"] == 0 for m in steps)
    assert max(m["kept_size_mean"] for m in steps) < 40  # top-p keeps a part of the vocabulary
    assert sum(m["kept_mass_mean"] for m in steps) / len(steps) < 0.999
    # at max_staleness 0 the learner's old log-probs are the behaviour's, over the kept set
    assert max(m["ratio_out_of_band"] for m in steps) == 0.0
    assert max(m["behavior_gap_abs_max"] for m in steps) < 1e-3
    ev = json.loads((run_dir / "eval.json").read_text())
    assert ev["final_accuracy"] > ev["initial_accuracy"]
