"""bench/gpu_sweep.py (the one-GPU vLLM staleness sweep) without a GPU: the config it writes is
valid, the sweep it starts colocates the producer with the learner, and its report reads the
sweep's results.csv."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType

from common import config as C
from launch.placement import plan
from launch.stress.results import COLUMNS, write_csv

ROOT = Path(__file__).resolve().parents[2]


def gpu_sweep() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_sweep", ROOT / "bench" / "gpu_sweep.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_config_is_valid_and_trains_in_bf16_with_every_group_kept(tmp_path):
    bench = gpu_sweep()
    path = tmp_path / "sweep.toml"
    path.write_text(bench.config_text("/models/q05", device="cuda", sets=["train.lr=2e-6"]))
    cfg = C.load(path)
    assert (cfg.model.path, cfg.model.device, cfg.model.dtype) == (
        "/models/q05",
        "cuda",
        "bfloat16",
    )
    assert (cfg.snapshot.dtype, cfg.train.drop_zero_variance, cfg.train.lr) == (
        "bfloat16",
        False,
        2e-6,
    )
    assert cfg.sampling.max_new_tokens <= cfg.vllm.max_model_len


def test_the_sweep_puts_one_vllm_producer_beside_the_learner_on_gpu0(tmp_path):
    bench = gpu_sweep()
    args = bench.stress_args(tmp_path, tmp_path / "c.toml", engine="vllm", device="cuda",
                             steps=20, staleness="0,2", colocated_memory=0.3)  # fmt: skip
    flags = {a: b for a, b in itertools.pairwise(args) if a.startswith("--")}
    assert flags["--max-staleness"] == "0,2"
    assert "--no-heldout" in args
    where = plan(
        num_gpus=1, engine="vllm", producers=None,
        learner_gpus=[int(flags["--learner-gpus"])], producer_gpus=[int(flags["--producer-gpus"])],
        colocated_memory=float(flags["--colocated-memory"]),
    )  # fmt: skip
    assert where.describe() == "learner gpu0; p1 gpu0 (vllm 0.30)"
    assert "--learner-gpus" not in bench.stress_args(
        tmp_path, tmp_path / "c.toml", engine="hf", device="cpu", steps=2, staleness="0,2",
        colocated_memory=0.3,
    )  # fmt: skip


def test_the_report_reads_steps_per_hour_and_reward_at_equal_wall_clock(tmp_path):
    rows = [
        {"setting": "ms0-p1-token-truncate-s0", "status": "ok", "steps_per_hour": 600.0,
         "speedup_vs_sync": 1.0, "reward_at_equal_time": 0.25, "placement": "learner gpu0"},
        {"setting": "ms2-p1-token-truncate-s0", "status": "ok", "steps_per_hour": 900.0,
         "speedup_vs_sync": 1.5, "reward_at_equal_time": 0.5, "placement": "learner gpu0"},
    ]  # fmt: skip
    write_csv(tmp_path / "results.csv", rows)
    report = gpu_sweep().summarize(tmp_path / "results.csv")
    stale = report["ms2-p1-token-truncate-s0"]
    assert (stale["steps_per_hour"], stale["speedup_vs_sync"]) == (900.0, 1.5)
    assert stale["reward_at_equal_time"] == 0.5
    assert stale["placement"] == "learner gpu0"
    assert set(bench_columns := gpu_sweep().REPORTED) <= set(COLUMNS), bench_columns
