"""bench/truncated_sampling.py: a short real run (the demo model, one round per case) writes the
stable JSON keys, with the kept-set ratio at 1 and the full-vocabulary one below it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "ratio_mean_kept_set", "ratio_max_abs_dev_kept_set", "ratio_mean_full_vocab",
    "wire_bytes_per_token", "wire_budget_bytes_per_token", "decode_ratio_top_k_20",
    "learner_step_ratio_top_k_20", "cases", "wire", "load_avg_start", "load_avg_end",
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_short_run_writes_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(ROOT / "bench" / "truncated_sampling.py"), "--json", str(out),
           "--steps", "1", "--repeats", "2"]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=540)
    data = json.loads(out.read_text())
    assert data.keys() >= KEYS
    for case in ("top_p_0.9", "top_k_8"):
        c = data["cases"][case]
        assert abs(c["ratio_mean_kept_set"] - 1) < 1e-5
        assert c["ratio_max_abs_dev_kept_set"] < 1e-4
        assert c["ratio_mean_full_vocab"] < 1
    assert data["wire"]["large_top_k_20"]["extra_bytes_per_kept_id"] == pytest.approx(4, abs=0.01)
