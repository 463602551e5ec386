"""Backpressure and many producers, end to end: a real `asyncgrpo consumer` process with a
simulated (slow) learner step, and the project's own `Producer`s with the fake engine in this
process (bench/swarm.py's machinery), until the consumer's `--steps` are done.

- fast producers, slow learner, a small queue: the consumer never holds more than its bound
  (from its metrics), producers were told to hold, and nothing is lost (every lease trained
  or ended by the shutdown; the ledger balances against leases.jsonl);
- 256 producers in one process: every lease accounted for, the ledger balanced, every producer
  ends with exit code 0.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from common.files import run_files as RF
from common.files.metrics import read_steps
from tests.e2e.test_bench_swarm import bench_module
from tests.ledger_invariant import assert_run_balanced
from tests.procs import endpoint


def run_swarm(
    swarm: ModuleType, tmp_path: Path, n: int, args: list[str]
) -> tuple[Path, list[int], str]:
    """A consumer for `args` (bench/swarm.py's flags) and `n` producers until its run ends:
    (run directory, the producers' exit codes, the consumer's log)."""
    a = swarm.parser().parse_args(args)
    run, prompts, log = tmp_path / "run", tmp_path / "prompts.jsonl", tmp_path / "consumer.log"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"p{i}", "answer": "a"}) + "\n" for i in range(4096))
    )
    with open(log, "wb") as out:
        consumer = subprocess.Popen(swarm.consumer_args(run, prompts, a), stdout=out, stderr=out)
    try:
        codes = asyncio.run(swarm.run_producers(n, endpoint(run, [consumer]), a, timeout_s=150))
        assert consumer.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    return run, codes, log.read_text()


def assert_nothing_lost(run: Path, *, steps: int, prompts_per_step: int) -> dict[str, int]:
    """Every lease was trained, or is a group the learner did not need when the run ended
    (expired by the shutdown, its prompt kept for a resume); none timed out or went missing."""
    ledger = assert_run_balanced(run)
    records = RF.read_leases(run)
    states = Counter(r.state for r in records)
    assert states["trained"] == steps * prompts_per_step
    assert states["rejected_invalid"] == 0
    lost = [r for r in records if r.state == "expired" and r.reason != "shutdown"]
    assert not lost, lost[:3]
    assert ledger.balance.open == 0
    return dict(states)


@pytest.mark.timeout(180)
def test_a_slow_learner_holds_producers_back_within_its_bound_and_loses_nothing(tmp_path):
    swarm = bench_module()
    # groups of 8 x 2,048 tokens (~131 KiB encoded); at most 0.5 MiB of them queued (3 groups),
    # while the staleness window lets 16 producers hold 4 x 4 leases' groups at once
    max_bytes = int(0.5 * (1 << 20))
    args = [
        "--steps", "8", "--step-s", "0.25", "--prompts-per-step", "4", "--max-staleness", "3",
        "--tokens", "2048", "--in-flight", "2", "--max-message-mib", "0.5",
        "--set", "net.max_queued_mib=0.5", "--set", "net.heartbeat_s=0.2",
        "--set", "net.producer_timeout_s=30", "--set", "task.max_row_kib=64",
    ]  # fmt: skip
    run, codes, log = run_swarm(swarm, tmp_path, 8, args)
    assert codes == [0] * 8, log[-3000:]
    assert_nothing_lost(run, steps=8, prompts_per_step=4)
    steps = read_steps(run / RF.METRICS)
    assert len(steps) == 8
    peaks = [r.queued_bytes_peak for r in steps]
    assert all(p is not None and p <= max_bytes for p in peaks), peaks
    assert max(p for p in peaks if p is not None) > 0
    assert steps[-1].holds is not None
    assert steps[-1].holds > 0, "the producers were never told to hold: no backpressure"
    assert steps[-1].hold_s_max is not None
    assert steps[-1].hold_s_max > 0
    admission = RF.read_ledger(run).admission
    assert admission is not None
    assert admission.queued_bytes_max is not None
    assert 0 < admission.queued_bytes_max <= max_bytes  # over the whole run
    assert admission.holds is not None
    assert admission.holds >= steps[-1].holds


@pytest.mark.timeout(240)
def test_256_producers_in_one_process_account_for_every_lease(tmp_path):
    swarm = bench_module()
    args = ["--steps", "12", "--prompts-per-step", "32", "--max-staleness", "3"]
    run, codes, log = run_swarm(swarm, tmp_path, 256, args)
    assert codes == [0] * 256, (Counter(codes), log[-3000:])
    states = assert_nothing_lost(run, steps=12, prompts_per_step=32)
    ledger = RF.read_ledger(run)
    assert ledger.balance.issued == sum(states.values())
    assert len(ledger.by_producer) > 32  # the leases went around, not to a few producers
