"""The sharded consumer through the CLI: `asyncgrpo consumer --nproc-per-node 2` (torchrun, gloo
ranks on this CPU, FSDP2) with a real tiny model and fake producers over loopback ZeroMQ.

- 10 steps end to end: every metrics line says world_size 2, the log says how the model was
  sharded, rank 1 ends when rank 0 says so, the checkpoint is a DCP one, the ledger balances;
  then the same run resumes in one process (world size 1) for 2 more steps.
- a rank that dies (SIGKILL) or hangs (SIGSTOP, dist.timeout_s = 10) ends the learner with a
  non-zero exit code and one clear line in the log, and `--resume` on 2 ranks continues from
  the last checkpoint to a balanced ledger.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # procs, ledger_invariant
from ledger_invariant import assert_run_balanced
from procs import cli, endpoint, read_jsonl, stop, wait_for

from common.files import run_files as RF


def _prompts(path: Path) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n"
                            for i in range(64)))  # fmt: skip
    return path


def _consumer(tmp: Path, run_dir: Path, model: Path, steps: int, *extra: str, log: str):
    sets = [
        f"model.path={model}", "task.source=jsonl", f"task.path={_prompts(tmp / 'p.jsonl')}",
        "sampling.group_size=4", "sampling.max_new_tokens=8", "train.prompts_per_step=4",
        "train.lr=1e-3", "net.control_port=0", "net.producer_timeout_s=5",
        "net.heartbeat_s=0.2", "train.checkpoint_every=5", "model.device=cpu",
    ]  # fmt: skip
    args = ["consumer", "--run-dir", str(run_dir), "--steps", str(steps)]
    for s in sets:
        args += ["--set", s]
    return cli(*args, *extra, log=tmp / log)  # extra after: its --set wins


def _producers(tmp: Path, ep: str, tag: str):
    return [
        cli("producer", "--connect", ep, "--engine", "fake", "--id", name,
            "--set", "fake.latency_s=0.02", "--set", "net.heartbeat_s=0.2",
            "--set", "net.consumer_timeout_s=60", log=tmp / f"{name}-{tag}.log")
        for name in ("p1", "p2")
    ]  # fmt: skip


def _run(tmp: Path, run_dir: Path, model: Path, steps: int, *extra: str, tag: str) -> int:
    """A consumer and two producers until the consumer ends; its exit code."""
    consumer = _consumer(tmp, run_dir, model, steps, *extra, log=f"consumer-{tag}.log")
    producers = []
    try:
        producers = _producers(tmp, endpoint(run_dir, [consumer], timeout_s=180), tag)
        code = consumer.wait(300)
        for p in producers:
            p.wait(60)
    finally:
        stop(consumer, *producers)
    return code


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_rank_consumer_trains_ten_steps_then_resumes_in_one_process(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    code = _run(tmp_path, run_dir, tiny_model_dir, 10, "--nproc-per-node", "2", tag="2")
    log = (tmp_path / "consumer-2.log").read_text()
    assert code == 0, log[-3000:]
    metrics = read_jsonl(run_dir / RF.METRICS)
    assert [m["step"] for m in metrics] == list(range(1, 11))
    assert {m["world_size"] for m in metrics} == {2}
    assert "learner sharded: FSDP2 over 2 ranks, 2 decoder layers + root" in log
    assert "rank 1: rank 0 ended the run" in (run_dir / "consumer-rank1.log").read_text()
    assert list((run_dir / "checkpoints").glob("v000010-*/dcp/.metadata"))
    assert (run_dir / "snapshots" / "v000010" / "model.safetensors").exists()
    assert_run_balanced(run_dir)

    code = _run(tmp_path, run_dir, tiny_model_dir, 12, "--resume", tag="1")
    assert code == 0, (tmp_path / "consumer-1.log").read_text()[-3000:]
    metrics = read_jsonl(run_dir / RF.METRICS)
    assert [(m["step"], m["world_size"]) for m in metrics[-3:]] == [(10, 2), (11, 1), (12, 1)]
    assert_run_balanced(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_a_rank_that_dies_or_hangs_ends_the_learner_and_resume_continues(
    tmp_path: Path, tiny_model_dir: Path, how: str
) -> None:
    run_dir = tmp_path / "run"
    consumer = _consumer(tmp_path, run_dir, tiny_model_dir, 1000, "--nproc-per-node", "2",
                         "--set", "train.checkpoint_every=2", "--set", "dist.timeout_s=10",
                         log="consumer-a.log")  # fmt: skip
    producers, pid = [], 0
    try:
        producers = _producers(tmp_path, endpoint(run_dir, [consumer], timeout_s=180), "a")
        metrics = run_dir / RF.METRICS
        wait_for(lambda: metrics.exists() and len(read_jsonl(metrics)) >= 3, timeout_s=180,
                 what="three steps", procs=[consumer])  # fmt: skip
        rank1 = run_dir / "consumer-rank1.log"
        pid = int(re.search(r"rank 1 of 2 \(pid (\d+)\)", rank1.read_text()).group(1))  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL if how == "dies" else signal.SIGSTOP)
        code = consumer.wait(120)  # dist.timeout_s = 10 for the hung rank
    finally:
        stop(consumer, *producers)
        if how == "hangs" and pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    log = (tmp_path / "consumer-a.log").read_text()
    assert code != 0
    assert "another learner rank died or did not answer within dist.timeout_s" in log, log[-3000:]
    trained = len(read_jsonl(run_dir / RF.METRICS))

    code = _run(tmp_path, run_dir, tiny_model_dir, trained + 2, "--nproc-per-node", "2",
                "--resume", tag="b")  # fmt: skip
    assert code == 0, (tmp_path / "consumer-b.log").read_text()[-3000:]
    steps = [m["step"] for m in read_jsonl(run_dir / RF.METRICS)]
    assert steps == list(range(1, trained + 3))  # the lines after the checkpoint were redone
    assert_run_balanced(run_dir)
