"""The sharded learner on GPUs (NCCL for FSDP2, gloo for rank 0's orders): two GPUs against one
on the same batches in float32, and a bf16 mixed-precision run (bf16 compute, fp32 reduction
and master weights). Needs two CUDA devices.

Run on such a machine: `pytest -m gpu tests/gpu/test_sharded_gpu.py`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from sharded_steps import max_diff, run, torchrun

TESTS = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]


def test_two_gpus_equal_one_gpu_in_float32(tiny_model_dir: Path, tmp_path: Path) -> None:
    cases = ["token-mean", "packed-ckpt-2updates-kl"]
    torchrun(2, str(TESTS / "sharded_steps.py"), str(tiny_model_dir), str(tmp_path / "two"),
             "--steps", "3", "--record", "3", "--cases", ",".join(cases),
             "--set", "model.device=cuda", log=tmp_path / "torchrun.log")  # fmt: skip
    run(tiny_model_dir, tmp_path / "one", steps=3, record={3}, cases=cases,
        sets={"model.device": "cuda"})  # fmt: skip
    for name in cases:
        file = f"{name}/step3.safetensors"
        assert max_diff(tmp_path / "one" / file, tmp_path / "two" / file) <= 1e-4, name


def test_two_gpus_train_in_bf16_with_fp32_master_weights(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    torchrun(2, str(TESTS / "sharded_steps.py"), str(tiny_model_dir), str(tmp_path / "two"),
             "--steps", "3", "--record", "1,3", "--cases", "token-mean",
             "--set", "model.device=cuda", "--set", "model.dtype=bfloat16",
             log=tmp_path / "torchrun.log")  # fmt: skip
    assert "bf16 compute, float32 reduction" in (tmp_path / "torchrun.log").read_text()
    out = tmp_path / "two" / "token-mean"
    metrics = json.loads((out / "step3.json").read_text())
    assert math.isfinite(metrics["grad_norm"])
    assert metrics["num_tokens"] > 0
    weights = load_file(out / "step3.safetensors")
    assert all(w.dtype == torch.float32 for w in weights.values())  # the gathered masters
    assert max_diff(out / "step1.safetensors", out / "step3.safetensors") > 0
