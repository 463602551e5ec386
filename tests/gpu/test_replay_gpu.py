"""Replay on a GPU: with `model.deterministic` (and padded SDPA attention), a recorded stream
trains to the same snapshot hashes every time, bf16 autocast included (docs/replay.md).

Run on a CUDA machine: `pytest -m gpu tests/gpu/test_replay_gpu.py`."""

from __future__ import annotations

import pytest
from replay_streams import STEPS, record, replay

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_deterministic_gpu_replay_repeats_every_snapshot_hash(tmp_path, tiny_model_dir, dtype):
    source = tmp_path / "run"
    record(source)
    settings = {"model.device": "cuda", "model.deterministic": True, "model.attention": "padded",
                "model.dtype": dtype}  # fmt: skip
    first = replay(tiny_model_dir, source, tmp_path / "a", **settings)
    assert sorted(first) == list(range(STEPS + 1))
    assert replay(tiny_model_dir, source, tmp_path / "b", **settings) == first
