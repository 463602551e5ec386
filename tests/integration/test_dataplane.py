"""consumer/snapshots/dataplane.py through real sockets: chunks on their own socket and thread, so
control is answered while the data socket is stuck or flooded; the same CurveZMQ allowlist as
control; every malformed request refused with its reason and counted, and the thread serving on."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth
from served import started_server

from common import config as C
from common import wire
from common.net.keys import Keys, load_keys
from common.weights import snapshot as snap
from consumer.server.server import Server
from consumer.snapshots.dataplane import DataPlane

CHUNK = 64 << 10
DATA = bytes(range(256)) * 1000  # 256,000 bytes: 4 chunks of 64 KiB
MONITORS: dict[zmq.Socket, zmq.Socket] = {}


def write_snapshot(run_dir: Path, version: int, data: bytes) -> None:
    path = snap.snapshot_dir(run_dir / "snapshots", version) / snap.WEIGHTS_FILE
    path.parent.mkdir(parents=True)
    path.write_bytes(data)


@contextlib.contextmanager
def serving(run_dir: Path, keys: Keys | None = None) -> Iterator[tuple[Server, zmq.Context]]:
    cfg = C.override(C.Config(), {"net.control_port": 0, "snapshot.chunk_mib": CHUNK / (1 << 20)})
    with started_server(cfg, run_dir, keys=keys) as served:
        yield served


def dealer(ctx: zmq.Context, port: int, keys: Keys | None = None) -> zmq.Socket:
    """A DEALER connected to `port` (its monitor, `MONITORS[sock]`, attached first)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        sock.curve_secretkey, sock.curve_publickey = keys.secret, keys.public
        sock.curve_serverkey = keys.server_public
    MONITORS[sock] = sock.get_monitor_socket()
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def close(sock: zmq.Socket) -> None:
    sock.disable_monitor()
    MONITORS.pop(sock).close(linger=0)
    sock.close(linger=0)


def reply(sock: zmq.Socket) -> wire.Message | wire.Chunk:
    assert sock.poll(30_000), "no reply within 30 s"
    return wire.decode_reply([f.buffer for f in sock.recv_multipart(copy=False)])


def chunk_req(req: int, version: int, offset: int, file: str = "weights") -> bytes:
    return wire.encode(wire.FileChunkRequest(req, version, file, offset, CHUNK))


def counters(srv: Server, name: str, at_least: float) -> dict[str, float]:
    """The server's counters once `name` reached `at_least` (they are read across threads)."""
    deadline = time.monotonic() + 30
    while (got := dict(srv.view()["counters"])).get(name, 0) < at_least:
        assert time.monotonic() < deadline, f"{name} stayed at {got.get(name, 0)}"
        time.sleep(0.01)
    return got


def test_control_is_answered_while_the_data_socket_is_stuck_and_flooded(tmp_path, monkeypatch):
    """The data thread is held inside its first request (a chunk of version 0 waits for an
    event) with 200 more requests queued behind it; a registration on control is answered all
    the same. Once released, the data thread refuses that request and serves the 200 in order."""
    write_snapshot(tmp_path, 1, DATA)
    release, inside = threading.Event(), threading.Event()
    serve = DataPlane._chunk

    def held(self: DataPlane, msg: wire.FileChunkRequest) -> wire.Chunk:
        if msg.version == 0:
            inside.set()
            assert release.wait(60)
        return serve(self, msg)

    monkeypatch.setattr(DataPlane, "_chunk", held)
    with serving(tmp_path) as (srv, ctx):
        data, control = dealer(ctx, srv.ports["data"]), dealer(ctx, srv.ports["control"])
        try:
            data.send(chunk_req(1, 0, 0))
            assert inside.wait(30)
            for req in range(2, 202):
                data.send(chunk_req(req, 1, (req % 4) * CHUNK))
            control.send(wire.encode(wire.Register(7, "p", "h", 1, "fake", -1)))
            welcome = reply(control)
            assert isinstance(welcome, wire.Welcome)
            assert welcome.spec.data_port == srv.ports["data"]
            assert not data.poll(0)  # nothing served yet: the data thread is still held
            release.set()
            stuck = reply(data)
            assert isinstance(stuck, wire.Reject)
            assert (stuck.req, stuck.reason) == (1, "snapshot_gone")
            for req in range(2, 202):
                got = reply(data)
                assert isinstance(got, wire.Chunk)
                assert (got.req, got.offset, got.total_bytes) == (req, (req % 4) * CHUNK, len(DATA))
                assert got.data == DATA[got.offset : got.offset + CHUNK]
        finally:
            release.set()  # never leave the data thread held
            close(data)
            close(control)
        assert counters(srv, "chunks_served", 200)["data_rejected.snapshot_gone"] == 1


def test_malformed_data_requests_are_refused_counted_and_the_thread_serves_on(
    tmp_path, monkeypatch
):
    write_snapshot(tmp_path, 1, DATA)
    write_snapshot(tmp_path, 2, b"")
    with serving(tmp_path) as (srv, ctx):
        sock = dealer(ctx, srv.ports["data"])
        cases = {
            "not_msgpack": [os.urandom(64), b"\xc1"],
            "schema_version": [b"\x82\xa6schema\x01\xa4kind\xa5group"],
            "unexpected_kind": [
                wire.encode(wire.Heartbeat(3, "p", 0, "idle", 0)),
                wire.encode(wire.FetchRequest(4, "p", 1, -1, "", None)),
            ],
            "bad_value": [chunk_req(5, 1, 0, file="../../etc/passwd")],
            "bad_offset": [chunk_req(6, 1, len(DATA) + 1), chunk_req(7, 1, -1)],
            "snapshot_gone": [chunk_req(8, 99, 0)],
        }
        try:
            for reason, payloads in cases.items():
                for payload in payloads:
                    sock.send(payload)
                    got = reply(sock)
                    assert isinstance(got, wire.Reject)
                    assert got.reason == reason
            sock.send_multipart([b"two", b"frames"])
            assert reply(sock).reason == "multipart"  # type: ignore[union-attr]
            # an empty file and a request for zero bytes are answered, not refused
            sock.send(chunk_req(9, 2, 0))
            empty = reply(sock)
            assert isinstance(empty, wire.Chunk)
            assert (empty.total_bytes, bytes(empty.data)) == (0, b"")

            def broken(self: DataPlane, msg: wire.FileChunkRequest) -> wire.Chunk:
                raise RuntimeError("a bug of ours")

            monkeypatch.setattr(DataPlane, "_chunk", broken)
            sock.send(chunk_req(10, 1, 0))
            assert reply(sock).reason == "internal_error"  # type: ignore[union-attr]
            monkeypatch.undo()
            sock.send(chunk_req(11, 1, 3 * CHUNK))
            last = reply(sock)
            assert isinstance(last, wire.Chunk)
            assert bytes(last.data) == DATA[3 * CHUNK :]
        finally:
            close(sock)
        got = counters(srv, "chunks_served", 2)
    for reason, payloads in cases.items():
        assert got[f"data_rejected.{reason}"] == len(payloads)
    assert got["data_rejected.multipart"] == 1
    assert got["data_rejected.internal_error"] == 1
    assert got["chunk_bytes_served"] == len(DATA) - 3 * CHUNK


def handshake_event(sock: zmq.Socket) -> int:
    """The first handshake outcome on `sock`'s connection (a monitor event number)."""
    from zmq.utils.monitor import parse_monitor_message

    outcomes = {
        zmq.EVENT_HANDSHAKE_SUCCEEDED,
        zmq.EVENT_HANDSHAKE_FAILED_AUTH,
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
    }
    monitor = MONITORS[sock]
    while True:
        assert monitor.poll(30_000), "no handshake within 30 s"
        event = parse_monitor_message(monitor.recv_multipart())["event"]
        if event in outcomes:
            return int(event)


@pytest.mark.parametrize("peer", ["stranger", "no_keys"])
def test_under_curve_a_peer_outside_the_allowlist_reads_no_chunk(tmp_path, peer):
    keys_dir, outside = tmp_path / "keys", tmp_path / "outside"
    keys_dir.mkdir()
    outside.mkdir()
    zmq.auth.create_certificates(keys_dir, "server")
    zmq.auth.create_certificates(keys_dir, "member")
    zmq.auth.create_certificates(outside, "stranger")
    server_keys = load_keys(keys_dir, "server")

    def client(directory: Path, name: str) -> Keys:
        public, secret = zmq.auth.load_certificate(directory / f"{name}.key_secret")
        assert secret is not None
        return Keys(directory, public, secret, server_keys.public)

    write_snapshot(tmp_path / "run", 1, DATA)
    with serving(tmp_path / "run", server_keys) as (srv, ctx):
        port = srv.ports["data"]
        intruder = dealer(ctx, port, client(outside, "stranger") if peer == "stranger" else None)
        member = dealer(ctx, port, client(keys_dir, "member"))
        try:
            intruder.send(chunk_req(1, 1, 0))  # queued on the intruder's side, never delivered
            refused = (
                {zmq.EVENT_HANDSHAKE_FAILED_AUTH}  # ZAP: not in the allowlist
                if peer == "stranger"
                else {zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL}
            )
            assert handshake_event(intruder) in refused
            assert handshake_event(member) == zmq.EVENT_HANDSHAKE_SUCCEEDED
            member.send(chunk_req(2, 1, 0))
            got = reply(member)
            assert isinstance(got, wire.Chunk)
            assert bytes(got.data) == DATA[:CHUNK]
            assert not intruder.poll(0)
        finally:
            close(intruder)
            close(member)
        served = counters(srv, "chunks_served", 1)
        assert served["chunks_served"] == 1  # the member's, and nobody else's
        assert not any(k.startswith("data_rejected") for k in served)
