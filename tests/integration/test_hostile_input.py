"""Hostile peers never stop the consumer, never get anything trained, and are counted exactly.

The consumer runs as a real process (simulated learner step, so it is quick) with CurveZMQ; its
keys directory holds the honest producers' key and an intruder's (both may connect). While the
honest fake producers work, the intruder throws every kind of bad frame at both sockets: garbage,
a 1,009-byte message of nested lists (once a RecursionError that ended the network thread), a
983 KB message of empty lists (once ~64 MB of Python objects), duplicate keys, frames that would
cost more than the decoding budget, wrong kinds, and forgeries: groups and requests in the name
of an honest producer, and groups for an honest producer's open leases under its own name. The
run completes its steps with a balanced ledger, and every counter is what the frames predict.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys

import msgpack
import numpy as np
import pytest
import zmq
import zmq.auth
from procs import cli, endpoint, stop, wait_for

from common import wire
from common.files import run_files as RF

STEPS = 5
P = 2  # prompts per step
HONEST_LEASES = 4  # what p1 holds while it stalls: max_in_flight = (max_staleness + 1) * P


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


DEEP = b"\x81\xa6schema" + b"\x91" * 1000 + b"\xc0"  # 1,009 bytes
WIDE = b"\x81\xa6schema\xdd" + struct.pack(">I", 983_000) + b"\x90" * 983_000
DUPLICATE = b"\x83\xa6schema\x02\xa4kind\xa5group\xa6schema\x02"
COSTLY = msgpack.packb(  # a heartbeat of 500 tiny counters: 5 bytes each, ~170 in Python
    {"schema": wire.SCHEMA_VERSION, "kind": "heartbeat", "req": 1, "producer_id": "x",
     "loaded_version": 0, "state": "idle", "num_in_flight": 0,
     "counters": {f"{i:03}": i for i in range(500)}}
)  # fmt: skip
# Frames for the rollouts socket that fail before anyone's identity matters, by reason.
GARBAGE = {
    "not_msgpack": [os.urandom(64), wire.encode(_group())[:40], b"\xc1", DEEP, WIDE,
                    b"\x81\xa6schema\xdb\xff\xff\xff\xff"],  # a 4 GiB string, claimed
    "not_a_map": [b"\x93\x01\x02\x03"],
    "schema_version": [b"\x82\xa6schema\x01\xa4kind\xa5group"],  # an older build
    "duplicate_key": [DUPLICATE],
    "over_budget": [COSTLY],
    "unexpected_kind": [wire.encode(wire.Heartbeat(1, "intruder", 0, "idle", 0))],
    "bad_logprob": [wire.encode(_group(behavior_logp=np.array([-1.0, np.nan, -1.0, -1.0])))],
    "token_out_of_range": [wire.encode(_group(completion_ids=np.array([4, 5, 6, 10**9])))],
    "group_size": [wire.encode(_group(completion_lens=np.array([2, 2]), rewards=np.array([1, 0]),
                                      finish_reasons=("stop",) * 2))],
    "not_registered": [wire.encode(_group(producer_id="ghost"))],
}  # fmt: skip


def make_keys(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("server", "client", "intruder"):
        zmq.auth.create_certificates(keys, name)
    public, secret = zmq.auth.load_certificate(keys / "intruder.key_secret")
    server, _ = zmq.auth.load_certificate(keys / "server.key")
    return keys, (public, secret, server)


def intruder_socket(ctx, kind, address, key):
    public, secret, server = key
    sock = ctx.socket(kind)
    sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(address)
    return sock


def issued_to(run_dir, producer: str) -> int:
    ledger = RF.latest_ledger(run_dir)
    return ledger.count(producer, "issued") if ledger is not None else 0


@pytest.mark.timeout(300)
def test_hostile_frames_on_both_sockets_are_counted_and_the_run_completes_with_honest_producers(
    tmp_path,
):
    keys, key = make_keys(tmp_path)
    run_dir = tmp_path / "run"
    sets = [
        "train.simulate_step_s=0.01", "sampling.group_size=4", f"train.prompts_per_step={P}",
        "staleness.max_staleness=1", "net.control_port=0", "net.max_message_mib=1",
        "task.max_row_kib=256", "task.source=jsonl", f"task.path={prompts_file(tmp_path)}",
    ]  # fmt: skip
    args = ["consumer", "--run-dir", str(run_dir), "--steps", str(STEPS), "--keys", str(keys)]
    for s in sets:
        args += ["--set", s]
    consumer = cli(*args, log=tmp_path / "consumer.log")
    procs = [consumer]
    ctx = zmq.Context()
    try:
        ep = endpoint(run_dir, procs)
        rollouts = RF.read_endpoints(run_dir / RF.ENDPOINTS).rollouts
        # p1 takes the first leases and sits on them (a stall) while the intruder works
        procs.append(cli(
            "producer", "--connect", ep, "--engine", "fake", "--id", "p1", "--keys", str(keys),
            "--set", f"producer.max_in_flight={HONEST_LEASES}", "--set", "net.heartbeat_s=0.2",
            "--set", "producer.stall_after_s=0.01", "--set", "producer.stall_s=12",
            log=tmp_path / "p1.log",
        ))  # fmt: skip
        wait_for(lambda: issued_to(run_dir, "p1") == HONEST_LEASES, timeout_s=60,
                 what="p1 to hold its leases", procs=procs)  # fmt: skip
        control = intruder_socket(ctx, zmq.DEALER, ep, key)

        def ask(payload: bytes) -> wire.Message:
            control.send(payload)
            assert control.poll(20_000), "the consumer must answer on control"
            return wire.decode(control.recv())

        control_expect = {
            "not_msgpack": [os.urandom(32), DEEP],
            "duplicate_key": [DUPLICATE],
            "over_budget": [COSTLY],
            "unexpected_kind": [  # chunks are for the data socket
                wire.encode(_group()), wire.encode(wire.FileChunkRequest(5, 0, "weights", 0, 1)),
            ],
            "not_registered": [wire.encode(wire.Heartbeat(1, "ghost", 0, "idle", 0))],
            "wrong_key": [wire.encode(m) for m in (  # p1 is bound to the honest key
                wire.Register(1, "p1", "h", 1, "fake", -1), wire.Heartbeat(2, "p1", 0, "idle", 0),
                wire.LeaseRequest(3, "p1", 8, 0), wire.Goodbye(4, "p1", ()),
            )],
        }  # fmt: skip
        for reason, payloads in control_expect.items():
            for payload in payloads:
                reply = ask(payload)
                assert (type(reply), reply.reason) == (wire.Reject, reason)
        control.send_multipart([b"three", b"frames", b"here"])  # no reply to a multipart
        welcome = ask(wire.encode(wire.Register(6, "intruder", "h", 1, "fake", -1)))
        assert isinstance(welcome, wire.Welcome)

        push = intruder_socket(ctx, zmq.PUSH, rollouts, key)
        for payloads in GARBAGE.values():
            for data in payloads:
                push.send(data)
        push.send_multipart([b"two", b"frames"])
        base = 0  # incarnation 0: p1's leases are the first ones issued, 0 .. HONEST_LEASES-1
        for lease_id in range(base, base + HONEST_LEASES):  # forged: another's open lease
            push.send(wire.encode(_group(lease_id=lease_id)))
        push.send(wire.encode(_group(lease_id=base, producer_id="p1")))  # p1's name, wrong key
        push.send(
            wire.encode(
                _group(
                    lease_id=base + 1,
                    producer_id="p1",  # p1's lease, garbage
                    behavior_logp=np.array([-1.0, 1.0, -1.0, -1.0]),
                )
            )
        )
        for i in range(100):  # leases nobody issued: acked to the intruder as expired
            push.send(wire.encode(_group(lease_id=10**6 + i)))
        big = intruder_socket(ctx, zmq.PUSH, rollouts, key)
        big.send(b"\x00" * (2 << 20))  # over ZMQ_MAXMSGSIZE: libzmq drops it and the peer
        procs.append(cli(
            "producer", "--connect", ep, "--engine", "fake", "--id", "p2", "--keys", str(keys),
            log=tmp_path / "p2.log",
        ))  # fmt: skip
        assert consumer.wait(180) == 0, (tmp_path / "consumer.log").read_text()[-3000:]
        for s in (control, push, big):
            s.close(linger=0)
    finally:
        stop(*procs)
        ctx.term()
    ledger = RF.read_ledger(run_dir)
    counters = ledger.counters
    expected = {f"rejected.{r}": len(v) for r, v in GARBAGE.items()}
    expected["rejected.multipart"] = 1
    expected["rejected.wrong_producer"] = HONEST_LEASES
    expected["rejected.wrong_key"] = 1
    expected["rejected.bad_logprob"] += 1
    expected["rejected"] = sum(expected.values())
    expected |= {f"control_rejected.{r}": len(v) for r, v in control_expect.items()}
    expected["control_rejected.multipart"] = 1
    expected["groups_unknown"] = 100
    assert {k: counters.get(k, 0) for k in expected} == expected
    assert not any(k.startswith("internal_error") for k in counters), counters
    balance = ledger.balance
    assert balance.ok
    assert balance.trained == STEPS * P
    assert balance.rejected_invalid == 0  # the garbage in p1's name did not end its lease
    assert set(ledger.by_producer) <= {"p1", "p2"}  # the intruder was credited nothing
    assert ledger.count("p1", "trained") >= 1
    log_text = (tmp_path / "consumer.log").read_text()
    assert log_text.count("rejected a group message: not_msgpack") == 1  # rate-limited


def test_a_non_loopback_bind_without_keys_is_refused_with_advice(tmp_path):
    consumer = cli(
        "consumer", "--run-dir", str(tmp_path / "run"), "--bind", "0.0.0.0", log=tmp_path / "c.log"
    )
    assert consumer.wait(60) == 2
    text = (tmp_path / "c.log").read_text()
    assert "net.bind_host" in text
    assert "asyncgrpo keys" in text
    assert "net.insecure = true" in text


@pytest.mark.timeout(240)
def test_a_wildcard_bind_advertises_an_address_a_producer_following_the_file_reaches(tmp_path):
    """endpoints.json of a consumer bound to 0.0.0.0 names this host (a producer on another host
    reads the same file), never 0.0.0.0, and a producer started with --connect-file trains."""
    import socket

    run_dir = tmp_path / "run"
    consumer = cli(
        "consumer", "--run-dir", str(run_dir), "--steps", "2", "--bind", "0.0.0.0", "--insecure",
        "--set", "train.simulate_step_s=0.01", "--set", "net.control_port=0",
        "--set", "sampling.group_size=2", "--set", "train.prompts_per_step=2",
        "--set", "task.source=jsonl", "--set", f"task.path={prompts_file(tmp_path)}",
        log=tmp_path / "consumer.log",
    )  # fmt: skip
    producer = cli(
        "producer", "--connect-file", str(run_dir / RF.ENDPOINTS), "--engine", "fake",
        "--insecure", log=tmp_path / "producer.log",
    )  # fmt: skip
    try:
        ep = endpoint(run_dir, [consumer])
        assert ep.startswith(f"tcp://{socket.gethostname()}:"), ep
        assert consumer.wait(120) == 0, (tmp_path / "consumer.log").read_text()[-2000:]
        assert producer.wait(60) == 0, (tmp_path / "producer.log").read_text()[-2000:]
    finally:
        stop(consumer, producer)
    assert "0.0.0.0" not in (run_dir / RF.ENDPOINTS).read_text()
    assert RF.read_ledger(run_dir).balance.trained == 4


@pytest.mark.timeout(240)
def test_curve_keys_admit_producers_with_keys_and_shut_out_those_without(tmp_path):
    from common.net.keys import create_keys

    keys = tmp_path / "keys"
    create_keys(keys, ["member", "stranger"])
    (keys / "clients" / "stranger.key").unlink()  # revoked: not in the consumer's allowlist
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
        # the two refused producers start together (neither can end the run, which needs the
        # member's groups): one without keys, and one whose key the consumer does not list
        outsider = cli(
            "producer", "--connect", ep, "--engine", "fake", "--set", "net.handshake_timeout_s=3",
            log=tmp_path / "outsider.log",
        )  # fmt: skip
        procs.append(outsider)
        stranger = cli(
            "producer", "--connect", ep, "--engine", "fake", "--keys",
            str(keys / "producers" / "stranger"), "--set", "net.handshake_timeout_s=60",
            log=tmp_path / "stranger.log",
        )  # fmt: skip
        procs.append(stranger)
        assert outsider.wait(60) == 2  # a handshake that fails: a configuration error
        said = (tmp_path / "outsider.log").read_text()
        assert "no answer from the consumer" in said
        assert "waiting for the consumer at" in said
        assert "gives up after net.handshake_timeout_s = 3 s)" in said
        assert "connected, but the security handshake fails" in said
        wait_for(
            lambda: "its security handshake failed (" in (tmp_path / "consumer.log").read_text(),
            timeout_s=30,
            what="the consumer's handshake line",
            procs=procs[:1],
        )
        # the stranger: refused, and told so at once (not a silent wait)
        assert stranger.wait(60) == 2
        said = (tmp_path / "stranger.log").read_text()
        assert "refused this producer's CurveZMQ key" in said
        assert "no answer from the consumer" not in said
        wait_for(lambda: "refused a CurveZMQ connection from 127.0.0.1" in
                 (tmp_path / "consumer.log").read_text(), timeout_s=30,
                 what="the consumer's refusal line", procs=procs[:1])  # fmt: skip
        member = cli("producer", "--connect", ep, "--engine", "fake", "--keys",
                     str(keys / "producers" / "member"), log=tmp_path / "member.log")  # fmt: skip
        procs.append(member)
        assert consumer.wait(120) == 0
        wait_for(
            lambda: member.poll() is not None, timeout_s=60, what="the keyed producer to finish"
        )
    finally:
        stop(*procs)
    ledger = RF.read_ledger(run_dir)
    assert ledger.balance.trained == 6
    assert ledger.counters["rejected.unknown_key"] >= 1  # the stranger's refused handshakes


@pytest.mark.timeout(240)
def test_a_key_outside_the_allowlist_on_the_data_socket_is_counted_where_control_refusals_are(
    tmp_path,
):
    """The data socket has its own key gate: its refusals were logged but counted nowhere."""
    from common.net.keys import create_keys, load_keys

    keys = tmp_path / "keys"
    create_keys(keys, ["stranger"])
    (keys / "clients" / "stranger.key").unlink()  # not in the consumer's allowlist
    stranger = load_keys(keys / "producers" / "stranger", "client")
    run_dir = tmp_path / "run"
    consumer = cli(
        "consumer", "--run-dir", str(run_dir), "--steps", "3", "--keys", str(keys),
        "--set", "net.control_port=0", "--set", "task.source=jsonl",
        "--set", f"task.path={prompts_file(tmp_path)}", log=tmp_path / "consumer.log",
    )  # fmt: skip
    ctx = zmq.Context()
    try:
        endpoint(run_dir, [consumer])
        data = RF.read_endpoints(run_dir / RF.ENDPOINTS).data
        assert data is not None
        sock = intruder_socket(ctx, zmq.DEALER, data, (stranger.public, stranger.secret,
                                                       stranger.server_public))  # fmt: skip
        sock.send(wire.encode(wire.FileChunkRequest(1, 0, "weights", 0, 1 << 20)))
        wait_for(lambda: "refused a CurveZMQ connection from 127.0.0.1" in
                 (tmp_path / "consumer.log").read_text(), timeout_s=60,
                 what="the consumer's refusal line", procs=[consumer])  # fmt: skip
        sock.close(linger=0)
        consumer.send_signal(signal.SIGINT)
        assert consumer.wait(60) == 0
    finally:
        stop(consumer)
        ctx.destroy(linger=0)
    ledger = RF.read_ledger(run_dir)
    assert ledger.counters.get("rejected.unknown_key", 0) >= 1, ledger.counters
    shown = subprocess.run(
        [sys.executable, "-m", "launch.cli", "status", str(run_dir)], capture_output=True,
        text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    assert "rejected.unknown_key" in shown, shown
    subprocess.run([sys.executable, "-m", "launch.cli", "report", str(run_dir)], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    assert "rejected.unknown_key" in (run_dir / RF.SUMMARY).read_text()
