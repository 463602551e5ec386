"""Producers that fetch every snapshot over the network hear the end of the run (real processes,
loopback sockets; each producer in its own mount namespace, where the consumer's run directory
is an empty tmpfs, so it cannot take the consumer's files).

The consumer answers a fetch report (`wire.FetchDone`) with a status, and building a status
hands over that producer's acks and, once the run takes no more groups, marks it told of the
end. The producer once dropped that reply: the consumer exited 0 believing everyone had heard
the end, while producers that fetch over the network ran on until `net.consumer_timeout_s`
(300 s) and exited 3, re-sending the groups whose acks they had lost (`groups_duplicate`).
Producers here beat at the default 1 s, so that a fetch report often comes before the next
heartbeat, and re-send an unacknowledged group after 2 s, so that a lost ack shows in the run.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from ledger_invariant import assert_run_balanced
from procs import cli, endpoint, hiding_unavailable, stop

PRODUCERS = 6
STEPS = 24
END_S = 20  # a producer must exit within this many seconds of the consumer (it once took 300)

pytestmark = pytest.mark.skipif(
    bool(hiding_unavailable()), reason=hiding_unavailable() or "available"
)


def producer(name: str, connect: str, hidden: Path, log: Path) -> subprocess.Popen[bytes]:
    """A fake-engine producer that sees `hidden` as an empty directory."""
    sets = ["--set", "net.resend_after_s=2", "--set", "fake.latency_s=0.02"]
    args = ["producer", "--connect", connect, "--engine", "fake", "--id", name, *sets]
    return cli(*args, log=log, hide=(hidden,))


@pytest.mark.timeout(400)
def test_producers_fetching_over_the_network_exit_with_the_consumer_and_resend_nothing(
    tmp_path,
):
    run_dir = tmp_path / "run"
    sets = [
        "train.simulate_step_s=0.25", "sampling.group_size=2", "train.prompts_per_step=6",
        "staleness.max_staleness=1", "net.control_port=0", "net.heartbeat_s=0.2",
    ]  # fmt: skip
    args = ["consumer", "--run-dir", str(run_dir), "--steps", str(STEPS)]
    for s in sets:
        args += ["--set", s]
    consumer = cli(*args, log=tmp_path / "consumer.log")
    procs = [consumer]
    try:
        ep = endpoint(run_dir, procs)
        for i in range(PRODUCERS):
            procs.append(producer(f"p{i}", ep, run_dir, tmp_path / f"p{i}.log"))
        assert consumer.wait(300) == 0, (tmp_path / "consumer.log").read_text()[-3000:]
        for i, p in enumerate(procs[1:]):
            try:
                code = p.wait(END_S)
            except subprocess.TimeoutExpired:
                code = None
            said = (tmp_path / f"p{i}.log").read_text()
            assert code == 0, f"p{i}: exit {code} {END_S} s after the consumer: {said[-2000:]}"
            assert "fetched over the network" in said, said[-2000:]
            assert "snapshots_local" not in said
    finally:
        stop(*procs)
    ledger = assert_run_balanced(run_dir)
    assert ledger.counters.get("groups_duplicate", 0) == 0, ledger.counters
