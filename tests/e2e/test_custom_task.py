"""The custom tasks of docs/custom_task/README.md. The JSONL example: its config loads, its JSONL
gives prompts and answers, its reward module scores on the producer side, and (slow) the whole
example trains through the CLI, the reward module importable only through PYTHONPATH as that
page says. The own-Parquet example: the code and config the page shows are those of its files,
and (slow) the page's commands, run as written in a copy of the directory, train through
`asyncgrpo launch` with a reward that reads two columns."""

from __future__ import annotations

import asyncio
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from procs import endpoint, stop

from common import config as C
from common.files import run_files as RF
from common.files.metrics import read_steps
from consumer.data.prompts import make_source
from consumer.data.sources import load_rows
from consumer.train.schedule import lr_factor
from producer.rewards.runner import RewardRunner

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "docs" / "custom_task"
PAGE = EXAMPLE / "README.md"
END_TO_END = "## Your own Parquet task, end to end"


def test_the_example_config_prompts_and_reward_work_together(monkeypatch):
    monkeypatch.chdir("/")  # task.path is read from the config file's directory, wherever we are
    cfg = C.load(EXAMPLE / "custom.toml")
    prompts = make_source(cfg.task, seed=0)
    assert len(prompts) == 300
    row = prompts.get(0)
    assert (row.prompt, row.answer, row.columns) == ("49-48=", "1", "")
    answer = row.answer
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


def _blocks(lang: str) -> list[str]:
    """The `lang` code blocks of the page's own-Parquet section, in order."""
    text = PAGE.read_text()
    part = text[text.index(END_TO_END) :]
    part = part[: part.find("\n## ", len(END_TO_END))]
    return re.findall(rf"^```{lang}\n(.*?)^```$", part, flags=re.M | re.S)


def test_the_parquet_example_shows_the_code_and_config_it_runs(tmp_path, monkeypatch):
    (shown_reward,) = _blocks("python")
    assert shown_reward in (EXAMPLE / "within.py").read_text()
    (shown_config,) = _blocks("toml")
    config = tomllib.loads((EXAMPLE / "within.toml").read_text())
    for section, values in tomllib.loads(shown_config).items():
        assert (
            (config[section] == values)
            if isinstance(values, list)
            else (values.items() <= config[section].items())
        ), section
    # the file the page's first command writes gives the rows the reward reads
    subprocess.run([sys.executable, str(EXAMPLE / "make_parquet.py"), str(tmp_path / "w.parquet")],
                   check=True, capture_output=True)  # fmt: skip
    cfg = C.override(C.load(EXAMPLE / "within.toml"), {"task.path": str(tmp_path / "w.parquet")})
    rows = load_rows(cfg.task)
    assert len(rows) == 300
    assert rows[0].prompt == "34+36="
    assert rows[0].answer == "70"
    assert rows[0].columns == '{"tolerance":1}'
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from within import within  # type: ignore[import-not-found]

    assert [within(c, "70", 1) for c in ("71", "068", "067", "x")] == [1.0, 0.5, 0.0, 0.0]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_parquet_example_trains_through_launch_with_the_commands_on_the_page(tmp_path):
    (commands,) = _blocks("bash")
    assert "asyncgrpo launch" in commands
    shutil.copytree(EXAMPLE, tmp_path / "docs" / "custom_task")  # the page's paths, in a copy
    bin_dir = Path(sys.executable).parent  # where `python` and `asyncgrpo` are installed
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    env.pop("PYTHONPATH", None)  # the page's PYTHONPATH is the reward's only way in
    log = tmp_path / "commands.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", commands], cwd=tmp_path,
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            assert proc.wait(800) == 0, log.read_text()[-3000:]
        finally:
            stop(proc)
    run_dir = tmp_path / "runs" / "within"
    cfg = C.load(tmp_path / "docs" / "custom_task" / "within.toml")
    metrics = read_steps(run_dir / RF.METRICS)
    assert len(metrics) == cfg.run.steps == 20
    assert all(math.isfinite(m.reward_mean) for m in metrics)
    assert any(m.reward_mean > 0 for m in metrics)  # within.py scored: exact, near, far
    t = cfg.train
    expected = [t.lr * lr_factor(s, schedule=t.lr_schedule, warmup=t.warmup_steps,
                                 total=cfg.run.steps, min_ratio=t.lr_min_ratio)
                for s in range(cfg.run.steps)]  # fmt: skip
    assert [m.lr for m in metrics] == pytest.approx(expected, rel=1e-9)
    producers = RF.read_producers(run_dir)
    assert producers
    assert all(p.reward_errors == p.reward_timeouts == 0 for p in producers.values()), producers
    assert RF.read_ledger(run_dir).balance.ok
