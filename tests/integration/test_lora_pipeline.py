"""A LoRA run through the CLI: a consumer and an hf producer over loopback ZeroMQ at
max_staleness 0, then `asyncgrpo export` and `asyncgrpo eval` of the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from procs import read_jsonl
from test_pipeline import synchronous_hf_run

from common.files import run_files as RF
from common.weights import adapter as fmt


@pytest.mark.slow  # ~70 s on a quiet 2-core machine (tests/integration/test_lora.py: the parts)
@pytest.mark.timeout(300)
def test_a_lora_run_samples_exactly_its_adapter_and_exports_a_model(tmp_path, tiny_model_dir):
    """Every step's groups were sampled with the learner's adapter of that version: behaviour
    and learner log-probs agree to 1e-5 (float32) after every update; snapshots are adapters
    a few percent of the model's size; the run exports and evaluates."""
    run_dir = synchronous_hf_run(
        tmp_path, tiny_model_dir, "model.lora.enabled=true", "model.lora.rank=4", steps=3
    )
    prompts = tmp_path / "prompts.jsonl"
    metrics = read_jsonl(run_dir / RF.METRICS)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["staleness_max"] == 0
        assert m["behavior_gap_abs_max"] < 1e-5, m["step"]
    weights = run_dir / RF.SNAPSHOTS / "v000003" / "model.safetensors"
    header = fmt.read_header(weights)
    assert header is not None
    assert header.base_hash == fmt.base_hash(tiny_model_dir)
    assert weights.stat().st_size < 0.15 * (tiny_model_dir / "model.safetensors").stat().st_size
    assert "adapters_wrong_base" not in (tmp_path / "run-hf1.log").read_text()

    exported = subprocess.run(
        [sys.executable, "-m", "launch.cli", "export", str(run_dir), "--out", str(tmp_path / "m")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "m" / "adapter" / fmt.PEFT_CONFIG_FILE).exists()
    tests = str(Path(__file__).parents[1])  # the run's reward module (reward_fixtures)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    scored = subprocess.run(
        [sys.executable, "-m", "launch.cli", "eval", str(run_dir), "--eval-path", str(prompts)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert scored.returncode == 0, scored.stderr
    again = subprocess.run(
        [sys.executable, "-m", "launch.cli", "export", str(run_dir), "--out", str(tmp_path / "m")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0
    assert "already exists" in again.stderr
