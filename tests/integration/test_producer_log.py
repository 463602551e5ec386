"""A producer's log at INFO says what changed, not every step twice: at most one line per
learner step (its `loaded weights vN` line, which says where the snapshot came from) besides a
few lines of its start and end."""

from __future__ import annotations

import json

import pytest
from procs import cli, endpoint, stop

STEPS = 8
START_AND_END = 6  # connecting, registered, the run's end: what a producer says once


@pytest.mark.timeout(240)
def test_a_producer_logs_at_most_one_info_line_per_step(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(20))
    )
    run_dir = tmp_path / "run"
    consumer = cli(
        "consumer", "--run-dir", str(run_dir), "--steps", str(STEPS),
        "--set", "train.simulate_step_s=0.01", "--set", "net.control_port=0",
        "--set", "sampling.group_size=2", "--set", "train.prompts_per_step=2",
        "--set", "task.source=jsonl", "--set", f"task.path={prompts}",
        log=tmp_path / "consumer.log",
    )  # fmt: skip
    procs = [consumer]
    try:
        ep = endpoint(run_dir, procs)
        producer = cli("producer", "--connect", ep, "--engine", "fake", log=tmp_path / "p.log")
        procs.append(producer)
        assert consumer.wait(120) == 0
        assert producer.wait(60) == 0
    finally:
        stop(*procs)
    lines = [line for line in (tmp_path / "p.log").read_text().splitlines() if " INFO " in line]
    loaded = [line for line in lines if "loaded weights v" in line]
    assert len(loaded) >= 2, lines  # the check below sees the lines it is about
    assert len(lines) <= STEPS + START_AND_END, "\n".join(lines)
