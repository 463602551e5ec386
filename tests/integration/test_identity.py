"""One producer cannot speak for another: ids are bound to CurveZMQ keys, leases to producers.

A real `Server` with CurveZMQ and two client keypairs in its keys directory (both may connect):
`a` registers with its key; the holder of the other key tries every way of speaking for `a`
(registering as `a`, heartbeats, goodbyes and groups as `a`) and of taking `a`'s credit under its
own id (a group for `a`'s open lease). Each is refused and counted, and `a` still delivers.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq
import zmq.auth
from served import started_server

from common import config as C
from common import wire
from common.net.keys import Keys, load_keys
from consumer.server.identity import Identities
from consumer.server.server import Server

G = 2


def _keys(directory, name: str, server: Keys) -> Keys:
    public, secret = zmq.auth.load_certificate(directory / f"{name}.key_secret")
    assert secret is not None
    return Keys(directory, public, secret, server.public)


def _socket(ctx, kind, port: int, keys: Keys):
    sock = ctx.socket(kind)
    sock.curve_secretkey, sock.curve_publickey = keys.secret, keys.public
    sock.curve_serverkey = keys.server_public
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def _request(sock, msg):
    sock.send(wire.encode(msg))
    assert sock.poll(10_000), "no reply"
    return wire.decode(sock.recv())


def _group(lease: wire.Lease, producer_id: str) -> wire.Group:
    return wire.Group(
        lease_id=lease.lease_id, producer_id=producer_id, prompt_index=lease.prompt_index,
        behavior_version=0, prompt_ids=np.array([1, 2], np.int32),
        completion_ids=np.array([3, 4], np.int32), completion_lens=np.ones(G, np.int32),
        behavior_logp=np.full(2, -1.0, np.float32), token_versions=np.zeros(0, np.int32),
        rewards=np.array([1.0, 0.0], np.float32), finish_reasons=("stop",) * G,
        temperature=1.0,
    )  # fmt: skip


def _counter(srv: Server, name: str, at_least: int) -> int:
    deadline = time.monotonic() + 30
    while (value := srv.view()["counters"].get(name, 0)) < at_least:
        assert time.monotonic() < deadline, f"{name} stayed at {value}"
        time.sleep(0.01)
    return value


@pytest.fixture
def keyed(tmp_path):
    keys_dir = tmp_path / "keys"
    keys_dir.mkdir()
    for name in ("server", "a", "b"):
        zmq.auth.create_certificates(keys_dir, name)
    server_keys = load_keys(keys_dir, "server")
    cfg = C.apply_overrides(
        C.Config(),
        ["net.control_port=0", f"sampling.group_size={G}", "train.prompts_per_step=2",
         "staleness.max_staleness=0", "task.epochs=1"],
    )  # fmt: skip
    with started_server(cfg, tmp_path, keys=server_keys) as (srv, ctx):
        yield srv, ctx, {n: _keys(keys_dir, n, server_keys) for n in ("a", "b")}


def test_a_producer_cannot_speak_for_another_or_take_its_leases(keyed, tmp_path):
    srv, ctx, keys = keyed
    ports = srv.ports
    a_control = _socket(ctx, zmq.DEALER, ports["control"], keys["a"])
    a_push = _socket(ctx, zmq.PUSH, ports["rollouts"], keys["a"])
    b_control = _socket(ctx, zmq.DEALER, ports["control"], keys["b"])
    b_push = _socket(ctx, zmq.PUSH, ports["rollouts"], keys["b"])
    assert isinstance(_request(a_control, wire.Register(1, "a", "h", 1, "fake", -1)), wire.Welcome)
    srv.announce_snapshot(wire.SnapshotInfo(0, 1, "00", str(tmp_path / "none")))
    leases = _request(a_control, wire.LeaseRequest(2, "a", 2, 0)).leases
    assert len(leases) == 2

    # b, with its own valid key, claims to be a: refused on every request
    for msg in (
        wire.Register(1, "a", "h", 2, "fake", -1),
        wire.Heartbeat(2, "a", 0, "idle", 0),
        wire.LeaseRequest(3, "a", 4, 0),
        wire.Goodbye(4, "a", ()),  # would expire a's leases ("not held")
    ):
        reply = _request(b_control, msg)
        assert (type(reply), reply.reason) == (wire.Reject, "wrong_key"), msg
    b_push.send(wire.encode(_group(leases[0], "a")))  # a group as a, from b's key
    _counter(srv, "rejected.wrong_key", 1)

    # b registers as itself and sends a group for a's open lease: not b's to deliver
    assert isinstance(_request(b_control, wire.Register(5, "b", "h", 2, "fake", -1)), wire.Welcome)
    b_push.send(wire.encode(_group(leases[0], "b")))
    _counter(srv, "rejected.wrong_producer", 1)
    # a garbage group naming a's lease and a, from b: refused without ending a's lease
    bad = _group(leases[1], "a")
    b_push.send(wire.encode(bad).replace(b"\xa4stop", b"\xa4stip"))
    _counter(srv, "rejected.bad_value", 1)

    # a delivers both of its leases: both are accepted, credited to a
    for lease in leases:
        a_push.send(wire.encode(_group(lease, "a")))
    got = [srv.next_group(timeout_s=10) for _ in leases]
    assert sorted(g.lease_id for g in got if g) == sorted(x.lease_id for x in leases)
    assert srv.next_group(timeout_s=0.2) is None  # nothing forged reached the trainer
    srv.settle_trained(got, trained_step=0)
    ledger = srv.balance()
    assert (ledger.trained, ledger.rejected_invalid, ledger.ok) == (2, 0, True)
    counters = srv.view()["counters"]
    assert counters["control_rejected.wrong_key"] == 4
    assert (counters["rejected.wrong_key"], counters["rejected.wrong_producer"]) == (1, 1)
    state = srv.checkpoint_state(logs=())
    assert state.identities["keys"] == {
        "a": keys["a"].public.decode(),
        "b": keys["b"].public.decode(),
    }
    for s in (a_control, a_push, b_control, b_push):
        s.close(linger=0)


def test_an_id_is_bound_anew_only_once_its_producer_is_gone_and_holds_nothing():
    ids = Identities()
    assert ids.bind("p", "K1", free=True)
    assert ids.allows("p", "K1")
    assert not ids.allows("p", "K2")
    assert not ids.bind("p", "K2", free=False)  # live, or holding leases
    assert ids.bind("p", "K1", free=False)  # the same key re-registers any time
    assert ids.bind("p", "K2", free=True)  # gone and holding nothing: moved to another host
    assert ids.allows("p", "K2")
    assert ids.allows("never-registered", "K9")  # restored leases of an old checkpoint
    restored = Identities()
    restored.load_state_dict(ids.state_dict())
    assert restored.keys == {"p": "K2"}


def test_a_connection_that_fails_its_security_handshake_is_counted_and_said(
    keyed, tmp_path, caplog
):
    """A producer without keys at a consumer with them, or with another consumer's server key,
    never reaches the key gate: the control socket's monitor says it (consumer/server/
    handshakes.py)."""
    import logging

    srv, ctx, keys = keyed
    port = srv.ports["control"]
    with caplog.at_level(logging.WARNING, logger="asyncgrpo.consumer"):
        bare = ctx.socket(zmq.DEALER)  # no keys at all
        bare.connect(f"tcp://127.0.0.1:{port}")
        bare.send(b"hello")
        _counter(srv, "rejected.handshake_mechanism", 1)
        other_server = Keys(
            directory=keys["a"].directory,
            public=keys["a"].public,
            secret=keys["a"].secret,
            server_public=zmq.curve_keypair()[0],  # not this consumer's
        )
        stranger = _socket(ctx, zmq.DEALER, port, other_server)
        stranger.send(b"hello")
        _counter(srv, "rejected.handshake_cryptographic", 1)
        bare.close(linger=0)
        stranger.close(linger=0)
    said = [r.getMessage() for r in caplog.records if "security handshake failed" in r.getMessage()]
    assert said[0].startswith("refused a connection to the control socket tcp://")
    assert (
        "(mechanism, HANDSHAKE_FAILED_PROTOCOL 0x11000002): it connects without CurveZMQ "
        "keys while this consumer has them" in said[0]
    )
    assert any("its keys were not made for this consumer" in s for s in said)
