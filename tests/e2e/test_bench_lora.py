"""bench/lora.py on the tiny model: every part runs (the memory part in its child processes) and
writes its figures under the stable JSON keys its docstring lists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "pub_full_bytes",
    "pub_lora_bytes",
    "pub_bytes_ratio",
    "pub_full_s",
    "pub_lora_s",
    "pub_latency_ratio",
    "mem_full_mib",
    "mem_lora_mib",
    "mem_ratio",
    "mem_owners",
    "mem_ckpt_full_mib",
    "mem_ckpt_lora_mib",
    "mem_ckpt_ratio",
    "mem_ckpt_owners",
    "mem_malloc",
    "exact_tokens",
    "exact_lora_max",
    "exact_lora_mean",
    "exact_base_max",
    "exact_base_mean",
    "exact_learner_self_max",
    "exact_learner_self_mean",
    "exact_engine_self_max",
    "exact_engine_self_mean",
    "exact_engine_f64_max",
    "exact_engine_f64_mean",
    "exact_learner_f64_max",
    "exact_learner_f64_mean",
    "exact_unmerged_max",
    "exact_unmerged_mean",
    "exact_lora_engine_f64_max",
    "exact_lora_engine_f64_mean",
    "exact_lora_learner_f64_max",
    "exact_lora_learner_f64_mean",
    "engine_merged_s",
    "engine_unmerged_s",
    "engine_unmerged_over_merged",
    "rank",
    "trainable_params",
    "total_params",
    "threads",
    "load_avg_1min",
}


@pytest.mark.slow  # ~40 s: six processes build a learner or an engine
def test_bench_lora_writes_every_figure_under_its_stable_keys(tiny_model_dir, tmp_path):
    out = tmp_path / "lora.json"
    args = ["--model", str(tiny_model_dir), "--rank", "2", "--versions", "1", "--steps", "1"]
    args += ["--prompts", "2", "--rounds", "1", "--exact-prompts", "2", "--json", str(out)]
    args += ["--config", str(ROOT / "launch" / "configs" / "demo.toml")]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "lora.py"), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert set(figures) == KEYS
    assert 0 < figures["pub_bytes_ratio"] < 1  # the adapter is smaller than the model
    assert 0 < figures["trainable_params"] < figures["total_params"]
    assert all(figures[k] > 0 for k in ("pub_full_s", "mem_full_mib", "engine_merged_s"))
    owners = figures["mem_owners"]
    assert owners["lora"]["grads_mb"] < owners["full"]["grads_mb"]  # the adapter's grads only
    assert owners["lora"]["optimizer_mb"] < owners["full"]["optimizer_mb"]
    assert figures["exact_tokens"] > 0
    assert figures["exact_lora_max"] < 1e-5  # the tiny model: exact to float32 rounding
    assert "publication:" in done.stdout
