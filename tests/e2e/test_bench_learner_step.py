"""bench/learner_step.py on a CPU: its length mix, a short real run of both steps with the stable
JSON keys, and a step that runs out of memory reported as a result (the CUDA path, simulated)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "learner_step", ROOT / "bench" / "learner_step.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_qwen05_length_mix_has_the_promised_ranges_and_a_long_tail(bench):
    mix = bench.SHAPES["qwen05"]["mix"]
    batch = bench.groups(64, 8, 151936, lengths="mix", prompt_tokens=0, tokens=0, mix=mix, seed=0)
    prompts = np.array([len(g.prompt_ids) for g in batch])
    completions = np.concatenate([g.completion_lens for g in batch])
    assert prompts.min() >= 64
    assert prompts.max() <= 512
    assert prompts.max() - prompts.min() > 300  # spread over the range, not one length
    assert completions.min() >= 32
    assert completions.max() <= 1024
    assert 120 <= np.median(completions) <= 190  # median 150 (log-normal)
    assert (completions >= 600).sum() >= 5  # the long tail
    for g in batch:
        assert len(g.completion_ids) == len(g.behavior_logp) == int(g.completion_lens.sum())


def test_equal_lengths_are_exactly_the_ones_asked_for(bench):
    batch = bench.groups(
        3, 4, 100, lengths="equal", prompt_tokens=7, tokens=9, mix=bench.SHAPES["demo"]["mix"],
        seed=1,
    )  # fmt: skip
    assert [len(g.prompt_ids) for g in batch] == [7, 7, 7]
    assert all(g.completion_lens.tolist() == [9] * 4 for g in batch)
    rows = bench.bare_rows(batch)
    assert len(rows) == 12
    assert all(len(ids) == 16 and p == 7 for ids, p in rows)


def test_bad_arguments_are_refused_before_any_model_is_built(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--lengths", "equal,long"])
    assert "--lengths: equal or mix, got 'long'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--model", str(tmp_path)])
    assert "is not a model directory" in capsys.readouterr().err


def test_a_short_cpu_run_compares_both_steps_and_writes_the_stable_keys(
    bench, tiny_model_dir, tmp_path, capsys
):
    """The command's whole path in this process (`main(argv)`: a subprocess would spend most of
    its time importing)."""
    out = tmp_path / "learner_step.json"
    threads = torch.get_num_threads()
    try:
        bench.main(["--model", str(tiny_model_dir), "--lengths", "equal,mix", "--groups", "1",
                    "--repeats", "2", "--json", str(out)])  # fmt: skip
    finally:
        torch.set_num_threads(threads)  # the bench runs on one thread
    assert "Trainer.step" in capsys.readouterr().out
    res = json.loads(out.read_text())  # standard JSON: no NaN tokens
    assert res["device"] == "cpu"
    assert res["model"] == str(tiny_model_dir)
    assert res["dtype"] == "float32"
    assert set(res["cases"]) == {"equal", "mix"}
    for lengths, case in res["cases"].items():
        assert case["lengths"] == lengths
        assert case["rows"] == 8
        assert case["tokens"] > case["completion_tokens"] > 0
        for name in ("baseline", "ours"):
            assert case[f"{name}_ms"] > 0
            assert case[f"{name}_tok_s"] == pytest.approx(case["tokens"] / case[f"{name}_ms"] * 1e3)
            assert case[f"{name}_oom"] is False
            assert case[f"{name}_peak_mib"] is None  # no peak memory on a CPU
        assert case["ratio"] == pytest.approx(case["ours_ms"] / case["baseline_ms"])
        assert case["speedup"] == pytest.approx(1 / case["ratio"])
        assert case["attention"].startswith("shared_prompt")  # a CPU's path: prompts once
        assert case["micro_batches"] == 1


def test_a_step_that_runs_out_of_memory_is_a_result(bench, tiny_model_dir, monkeypatch):
    """On CUDA an out-of-memory step is reported (`ours_oom`), the other step still measured,
    and the JSON holds null for what does not exist."""
    from consumer.train.trainer import DeviceTrainer

    def oom(self, groups):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(DeviceTrainer, "step", oom)
    a = bench.parse_args(["--model", str(tiny_model_dir), "--groups", "1", "--repeats", "1"])
    a.dtype, a.warmup = "float32", 1
    res = bench.run_case(a, tiny_model_dir, "equal", torch.device("cpu"))
    assert res["ours_oom"] is True
    assert res["baseline_oom"] is False
    assert res["baseline_ms"] > 0
    assert math.isnan(res["ours_ms"])
    assert res["micro_batches"] is None
    clean = bench.finite_or_none(res)
    assert clean["ours_ms"] is None
    assert clean["speedup"] is None
    assert clean["baseline_ms"] == res["baseline_ms"]
    json.dumps(clean, allow_nan=False)
