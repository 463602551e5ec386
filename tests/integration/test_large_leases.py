"""One producer holding 1,024 leases trains a run of 1,024 prompts per step (real processes, real
sockets; simulated learner step, fake engine).

Its grants of hundreds of leases with the default task's short prompts, and its registration and
goodbye naming them, were once refused as `over_budget` by the decoder (the producer logged "bad
reply from the consumer: over_budget" and the run trained nothing): common/wire/sizes.py.
"""

from __future__ import annotations

import pytest
from ledger_invariant import assert_run_balanced
from procs import cli, endpoint, read_jsonl, stop

from common.files import run_files as RF

STEPS = 2
P = 1024


@pytest.mark.timeout(300)
def test_one_producer_with_1024_leases_in_flight_trains_1024_prompts_per_step(tmp_path):
    run_dir = tmp_path / "run"
    sets = [
        "train.simulate_step_s=0.01", "sampling.group_size=2", f"train.prompts_per_step={P}",
        "staleness.max_staleness=0", "net.control_port=0", "net.heartbeat_s=0.2",
    ]  # fmt: skip
    args = ["consumer", "--run-dir", str(run_dir), "--steps", str(STEPS)]
    for s in sets:
        args += ["--set", s]
    consumer = cli(*args, log=tmp_path / "consumer.log")
    procs = [consumer]
    try:
        ep = endpoint(run_dir, procs)
        producer = cli(
            "producer", "--connect", ep, "--engine", "fake", "--id", "big",
            "--set", f"producer.max_in_flight={P}", "--set", "net.heartbeat_s=0.2",
            "--set", "fake.max_tokens=4", log=tmp_path / "producer.log",
        )  # fmt: skip
        procs.append(producer)
        assert consumer.wait(240) == 0, (tmp_path / "consumer.log").read_text()[-3000:]
        assert producer.wait(60) == 0, (tmp_path / "producer.log").read_text()[-3000:]
    finally:
        stop(*procs)
    said = (tmp_path / "producer.log").read_text()
    assert "bad reply" not in said
    ledger = assert_run_balanced(run_dir)
    assert ledger.balance.trained == STEPS * P
    assert ledger.count("big", "trained") == STEPS * P
    assert not any(k.startswith("control_rejected") for k in ledger.counters), ledger.counters
    assert [m["step"] for m in read_jsonl(run_dir / RF.METRICS)] == list(range(1, STEPS + 1))
