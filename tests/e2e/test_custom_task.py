"""The worked custom task (docs/custom_task/README.md): its config loads, its JSONL gives
prompts and answers, its reward module scores on the producer side, and (slow) the whole
example trains through the CLI, the reward module importable only through PYTHONPATH as that
page says."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from procs import endpoint, stop

from common import config as C
from common import run_files as RF
from common.metrics import read_steps
from consumer.server.prompts import make_source
from producer.rewards import RewardRunner

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "docs" / "custom_task"


def test_the_example_config_prompts_and_reward_work_together(monkeypatch):
    monkeypatch.chdir(ROOT)  # task.path is relative to the repository root, as documented
    cfg = C.load(EXAMPLE / "custom.toml")
    prompts = make_source(cfg.task, seed=0)
    assert len(prompts) == 300
    prompt, answer = prompts.get(0)
    assert (prompt, answer) == ("49-48=", "1")
    monkeypatch.syspath_prepend(str(EXAMPLE))  # what PYTHONPATH=docs/custom_task does
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLE))  # the reward workers (spawned) too

    async def score():
        async with (
            asyncio.timeout(60),
            RewardRunner(cfg.rewards.fns, timeout_s=cfg.rewards.timeout_s, workers=1) as runner,
        ):
            return await runner.score(["1", "2", "x", "-1 and more"], answer)

    scored = asyncio.run(score())
    np.testing.assert_allclose(scored.parts["closeness:closeness"], [1.0, 0.5, 0.0, 1 / 3])
    np.testing.assert_allclose(scored.rewards, [1.5, 0.5, 0.0, 1 / 3])
    assert scored.num_errors == scored.num_timeouts == 0


def _cli(*args: str, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "launch.cli", *args], stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", **env}, cwd=ROOT, start_new_session=True,
        )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_worked_example_trains_with_its_own_reward(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    steps = 3
    consumer = _cli(
        "consumer", "--config", str(EXAMPLE / "custom.toml"), "--model", str(tiny_model_dir),
        "--run-dir", str(run_dir), "--steps", str(steps), "--set", "net.control_port=0",
        "--set", "train.drop_zero_variance=false", "--set", "train.prompts_per_step=2",
        log=tmp_path / "consumer.log", env={},
    )  # fmt: skip
    procs = [consumer]
    try:
        ep = endpoint(run_dir, procs, timeout_s=300)
        procs.append(_cli("producer", "--connect", ep, "--engine", "hf", log=tmp_path / "p.log",
                          env={"PYTHONPATH": "docs/custom_task"}))  # fmt: skip
        assert consumer.wait(500) == 0, (tmp_path / "consumer.log").read_text()[-3000:]
        assert procs[1].wait(60) == 0
    finally:
        stop(*procs)
    metrics = read_steps(run_dir / RF.METRICS)
    assert len(metrics) == steps
    producers = RF.read_producers(run_dir)  # no failed reward call, counted or logged
    assert len(producers) == 1
    assert all(p.reward_errors == p.reward_timeouts == 0 for p in producers.values()), producers
    assert "(scored 0" not in (tmp_path / "p.log").read_text()
    # exact match alone gives multiples of 0.5 / 16 per step; closeness gives fractions
    sums = [m.reward_mean * 16 for m in metrics]
    assert any(not math.isclose(2 * s, round(2 * s), abs_tol=1e-4) for s in sums), sums
    assert RF.read_ledger(run_dir).balance.ok
