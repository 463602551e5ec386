"""`asyncgrpo stress`: a two-setting sweep through the CLI, checked against each run's ledger."""

from __future__ import annotations

import csv
import json

import pytest
from procs import cli, read_jsonl, stop

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(400)
def test_a_small_sweep_writes_consistent_results_within_each_bound(tmp_path):
    out = tmp_path / "sweep"
    sweep = cli(
        "stress", "--out", str(out), "--max-staleness", "0,2", "--steps", "8",
        "--gen-s", "0.05", "--step-s", "0.05", "--set", "sampling.group_size=4",
        "--set", "train.prompts_per_step=4", log=tmp_path / "stress.log",
    )  # fmt: skip
    try:
        assert sweep.wait(360) == 0, (tmp_path / "stress.log").read_text()[-3000:]
    finally:
        stop(sweep)
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["max_staleness"] for r in rows] == ["0", "2"]
    columns = (
        "producers", "engine", "is_mode", "steps", "wall_s", "steps_per_hour", "tokens_per_s",
        "learner_idle_frac", "trained", "dropped_stale", "expired", "staleness_max_trained",
        "tis_weight_mean", "ess", "speedup_vs_sync",
    )  # fmt: skip
    for column in columns:
        assert column in rows[0]
    assert float(rows[0]["speedup_vs_sync"]) == 1.0
    for row in rows:
        run_dir = out / "runs" / row["setting"]
        ledger = json.loads((run_dir / "ledger.json").read_text())["balance"]
        assert ledger["ok"] == 1
        for key in ("trained", "dropped_stale", "expired"):
            assert int(row[key]) == ledger[key], key
        assert int(row["steps"]) == 8
        assert int(row["trained"]) == 8 * 4
        bound = int(row["max_staleness"])
        trained = [r for r in read_jsonl(run_dir / "leases.jsonl") if r["state"] == "trained"]
        lags = [r["trained_step"] - r["behavior_version"] for r in trained]
        assert max(lags) == int(row["staleness_max_trained"]) <= bound
        assert min(lags) >= 0
    for name in ("throughput_vs_staleness", "idle_fractions", "staleness_histograms"):
        assert (out / "plots" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    assert "Staleness sweep" in (out / "summary.md").read_text()
