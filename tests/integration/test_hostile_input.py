"""Garbage on the consumer's sockets never stops it; every bad message is counted.

The consumer runs as a real process (simulated learner step, so it is quick); raw ZeroMQ
sockets throw malformed bytes at it; then a fake producer must still complete the run.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zmq
from procs import cli, endpoint, stop, wait_for

from common import wire

STEPS = 5


def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(20))
    )
    return path


def _group(**changes: object) -> wire.Group:
    fields = dict(
        lease_id=12345, producer_id="intruder", prompt_index=0, behavior_version=0,
        prompt_ids=np.array([1, 2, 3]), completion_ids=np.array([4, 5, 6, 7]),
        completion_lens=np.array([1, 1, 1, 1]), behavior_logp=np.full(4, -1.0),
        token_versions=np.zeros(0), rewards=np.array([1, 0, 1, 0]),
        finish_reasons=("stop",) * 4, temperature=1.0,
    )  # fmt: skip
    fields.update(changes)
    return wire.Group(**fields)  # type: ignore[arg-type]


GARBAGE = {
    "not_msgpack": [os.urandom(64), wire.encode(_group())[:40], b"\xc1"],
    "too_large": [],  # filled below: over net.max_message_mib never reaches the application
    "not_a_map": [b"\x93\x01\x02\x03"],
    "schema_version": [b"\x82\xa6schema\x02\xa4kind\xa5group"],
    # a str32 header declaring 4 GiB in a 12-byte message: refused without allocating
    "huge_length": [b"\x81\xa6schema\xdb\xff\xff\xff\xff"],
    "bad_logprob": [wire.encode(_group(behavior_logp=np.array([-1.0, np.nan, -1.0, -1.0])))],
    "token_out_of_range": [wire.encode(_group(completion_ids=np.array([4, 5, 6, 10**9])))],
    "group_size": [wire.encode(_group(completion_lens=np.array([2, 2]), rewards=np.array([1, 0]),
                                      finish_reasons=("stop",) * 2))],
}  # fmt: skip


@pytest.mark.timeout(240)
def test_garbage_on_every_socket_is_counted_and_the_run_still_completes(tmp_path):
    run_dir = tmp_path / "run"
    sets = [
        "train.simulate_step_s=0.01", "sampling.group_size=4", "train.prompts_per_step=2",
        "net.control_port=0", "net.max_message_mib=1", "task.source=jsonl",
        f"task.path={prompts_file(tmp_path)}",
    ]  # fmt: skip
    args = ["consumer", "--run-dir", str(run_dir), "--steps", str(STEPS)]
    for s in sets:
        args += ["--set", s]
    consumer = cli(*args, log=tmp_path / "consumer.log")
    procs = [consumer]
    try:
        ep = endpoint(run_dir, procs)
        ports = json.loads((run_dir / "endpoints.json").read_text())
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(ports["rollouts"])
        sent = 0
        for payloads in GARBAGE.values():
            for data in payloads:
                push.send(data)
                sent += 1
        push.send_multipart([b"two", b"frames"])
        push.send(b"\x00" * (2 << 20))  # over ZMQ_MAXMSGSIZE: libzmq drops it and the peer
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(ep)
        dealer.send(os.urandom(32))
        assert dealer.poll(10_000), "the consumer must answer garbage on control with a Reject"
        reply = wire.decode(dealer.recv())
        assert isinstance(reply, wire.Reject)
        assert reply.reason == "not_msgpack"
        for s in (push, dealer):
            s.close(linger=1000)
        ctx.term()

        producer = cli(
            "producer", "--connect", ep, "--engine", "fake", "--id", "good", log=tmp_path / "p.log"
        )
        procs.append(producer)
        assert consumer.wait(180) == 0, (tmp_path / "consumer.log").read_text()[-3000:]
    finally:
        stop(*procs)
    ledger = json.loads((run_dir / "ledger.json").read_text())
    counters = ledger["counters"]
    assert counters["rejected.not_msgpack"] >= len(GARBAGE["not_msgpack"]) + 1  # + huge_length
    for reason in (
        "not_a_map",
        "schema_version",
        "bad_logprob",
        "token_out_of_range",
        "group_size",
        "multipart",
    ):
        assert counters[f"rejected.{reason}"] >= 1, reason
    assert counters["rejected"] >= sent + 1
    assert ledger["balance"]["ok"] == 1
    assert ledger["balance"]["trained"] == STEPS * 2


def test_a_non_loopback_bind_without_keys_is_refused_with_advice(tmp_path):
    consumer = cli(
        "consumer", "--run-dir", str(tmp_path / "run"), "--bind", "0.0.0.0", log=tmp_path / "c.log"
    )
    assert consumer.wait(60) == 2
    text = (tmp_path / "c.log").read_text()
    assert "net.bind_host" in text
    assert "asyncgrpo keys" in text
    assert "--insecure" in text


@pytest.mark.timeout(240)
def test_curve_keys_admit_producers_with_keys_and_shut_out_those_without(tmp_path):
    from common.sockets import create_keys

    keys = tmp_path / "keys"
    create_keys(keys)
    run_dir = tmp_path / "run"
    consumer = cli(
        "consumer", "--run-dir", str(run_dir), "--steps", "3", "--keys", str(keys),
        "--set", "train.simulate_step_s=0.01", "--set", "net.control_port=0",
        "--set", "sampling.group_size=2", "--set", "train.prompts_per_step=2",
        "--set", "task.source=jsonl", "--set", f"task.path={prompts_file(tmp_path)}",
        log=tmp_path / "consumer.log",
    )  # fmt: skip
    procs = [consumer]
    try:
        ep = endpoint(run_dir, procs)
        outsider = cli(
            "producer", "--connect", ep, "--engine", "fake", "--set", "net.handshake_timeout_s=3",
            log=tmp_path / "outsider.log",
        )  # fmt: skip
        procs.append(outsider)
        assert outsider.wait(60) == 2
        assert "no answer from the consumer" in (tmp_path / "outsider.log").read_text()
        member = cli("producer", "--connect", ep, "--engine", "fake", "--keys", str(keys),
                     log=tmp_path / "member.log")  # fmt: skip
        procs.append(member)
        assert consumer.wait(120) == 0
        wait_for(
            lambda: member.poll() is not None, timeout_s=60, what="the keyed producer to finish"
        )
    finally:
        stop(*procs)
    assert json.loads((run_dir / "ledger.json").read_text())["balance"]["trained"] == 6
