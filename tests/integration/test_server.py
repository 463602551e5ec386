"""consumer/server/server.py through its typed handle: real sockets on loopback, a scripted
producer.

The training thread's whole view of the network thread is `Server`'s methods; these tests drive
one lease from grant to trained, a drop, the end of the run, a failure on the network thread
surfacing on the caller's thread (the data socket's chunks: test_dataplane.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import zmq
import zmq.asyncio
from served import request, started_server, two_completions

from common import config as C
from common import wire
from common.files import run_files as RF
from consumer.data.prompts import make_source
from consumer.server.server import Server
from consumer.server.wire_terms import run_spec

G = 2


@pytest.fixture(params=[()])
def server(tmp_path, request):
    """A server with one prompt per step, synchronous, lease requests answered at once (empty
    when nothing is free); the param: more overrides."""
    cfg = C.apply_overrides(
        C.Config(),
        ["net.control_port=0", f"sampling.group_size={G}", "train.prompts_per_step=1",
         "staleness.max_staleness=0", "task.epochs=1", "net.lease_wait_s=0", *request.param],
    )  # fmt: skip
    with started_server(cfg, tmp_path) as served:
        yield served


_request, _group = request, two_completions  # the scripted producer's messages


def test_the_spec_gets_the_bound_ports_and_keeps_its_typed_rewards(server):
    srv, _ = server
    assert srv.spec.rollouts_port == srv.ports["rollouts"] != 0
    assert srv.spec.announce_port == srv.ports["announce"] != 0
    assert all(isinstance(r, wire.RewardWeight) for r in srv.spec.reward_fns)


def test_a_lease_goes_from_grant_to_trained_and_the_ledger_balances(server, tmp_path):
    srv, ctx = server
    host = "tcp://127.0.0.1"
    control = ctx.socket(zmq.DEALER)
    control.connect(f"{host}:{srv.ports['control']}")
    push = ctx.socket(zmq.PUSH)
    push.connect(f"{host}:{srv.ports['rollouts']}")
    welcome = _request(control, wire.Register(1, "p", "h", 1, "fake", -1))
    assert isinstance(welcome, wire.Welcome)
    assert welcome.spec == srv.spec
    assert _request(control, wire.LeaseRequest(2, "p", 4, 0)).leases == ()  # nothing published
    srv.announce_snapshot(wire.SnapshotInfo(0, 1, "00", str(tmp_path / "none")))
    grant = _request(control, wire.LeaseRequest(3, "p", 4, 0))
    assert len(grant.leases) == 1  # the staleness bound: one step of one prompt
    first = grant.leases[0]
    push.send(wire.encode(_group(first, [1.0, 0.0])))
    got = srv.next_group(timeout_s=10)
    assert got is not None
    assert got.lease_id == first.lease_id
    srv.settle_trained([got], trained_step=0)
    assert srv.balance().trained == 1
    assert (tmp_path / RF.LEDGER).exists()

    srv.announce_snapshot(wire.SnapshotInfo(1, 1, "01", str(tmp_path / "none")))
    grant = _request(control, wire.LeaseRequest(4, "p", 4, 0))
    assert wire.Ack(first.lease_id, "trained") in grant.status.acks
    second = grant.leases[0]
    assert second.step == 1  # the policy version moved with the settlement
    push.send(wire.encode(_group(second, [1.0, 1.0])))
    dropped = srv.next_group(timeout_s=10)
    assert dropped is not None
    srv.drop(dropped, "dropped_zero_variance")
    srv.stop_granting()
    status = _request(control, wire.Heartbeat(5, "p", 0, "idle", 0))
    assert status.status.finished
    assert wire.Ack(second.lease_id, "dropped_zero_variance") in status.status.acks
    assert not srv.all_told_finished()  # told, its goodbye not yet answered (GOODBYE_WAIT_S)
    assert isinstance(_request(control, wire.Goodbye(6, "p", ())), wire.StatusReply)
    assert srv.all_told_finished()
    srv.expire_open("shutdown")
    balance = srv.balance()
    assert balance.ok
    assert balance.dropped_zero_variance == 1
    state = srv.checkpoint_state(logs=(RF.LEASES,))
    assert state.log_sizes[RF.LEASES] == (tmp_path / RF.LEASES).stat().st_size > 0
    control.close(linger=0)
    push.close(linger=0)


def test_a_failed_drop_reaches_the_training_thread_through_check(server):
    srv, _ = server
    lease = wire.Lease(
        lease_id=999,
        prompt_index=0,
        step=0,
        min_version=0,
        prompt="",
        answer="",
        messages=(),
        columns="",
    )
    srv.drop(_group(lease, [1.0, 0.0]), "dropped_stale")  # never granted: a lease-book bug
    with pytest.raises(RuntimeError, match="network thread has stopped"):
        srv.balance()  # queued after the drop: refused once the drop has failed
    with pytest.raises(RuntimeError, match="network thread failed") as info:
        srv.check()
    assert isinstance(info.value.__cause__, KeyError)  # the lease was never open


def _wait(predicate, what: str, timeout_s: float = 30.0):
    import time

    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return value


def test_a_message_whose_handling_raises_is_counted_and_the_network_thread_goes_on(
    server, tmp_path, monkeypatch
):
    srv, ctx = server
    control = ctx.socket(zmq.DEALER)
    control.connect(f"tcp://127.0.0.1:{srv.ports['control']}")
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{srv.ports['rollouts']}")
    assert isinstance(_request(control, wire.Register(1, "p", "h", 1, "fake", -1)), wire.Welcome)
    srv.announce_snapshot(wire.SnapshotInfo(0, 1, "00", str(tmp_path / "none")))
    (lease,) = _request(control, wire.LeaseRequest(2, "p", 1, 0)).leases

    handle, receive = srv._control.handle, srv._state.book.receive
    failed: list[int] = []

    def handle_or_fail(msg, key, identity):  # a bug of ours on the control path
        if isinstance(msg, wire.Heartbeat) and msg.num_in_flight == 7:
            raise RecursionError("as deep nesting once did through repr()")
        return handle(msg, key, identity)

    def receive_or_fail(lease_id, producer_id):  # ... and on the rollouts path
        if producer_id == "p" and lease_id == lease.lease_id and not failed:
            failed.append(lease_id)
            raise MemoryError
        return receive(lease_id, producer_id)

    monkeypatch.setattr(srv._control, "handle", handle_or_fail)
    monkeypatch.setattr(srv._state.book, "receive", receive_or_fail)
    reply = _request(control, wire.Heartbeat(3, "p", 0, "idle", 7))
    assert (reply.reason, reply.detail) == ("internal_error", "RecursionError")
    push.send(wire.encode(_group(lease, [1.0, 0.0])))
    _wait(lambda: srv.view()["counters"].get("internal_error.MemoryError"), "the MemoryError")
    push.send(wire.encode(_group(lease, [1.0, 0.0])))  # the producer re-sends: accepted now
    assert srv.next_group(timeout_s=10).lease_id == lease.lease_id
    assert isinstance(_request(control, wire.Heartbeat(4, "p", 0, "idle", 0)), wire.StatusReply)
    counters = srv.view()["counters"]
    assert counters["rejected.internal_error"] == 2
    assert counters["internal_error.RecursionError"] == 1
    srv.check()  # the network thread never failed
    control.close(linger=0)
    push.close(linger=0)


def _connect(srv, ctx, producer_id: str) -> zmq.Socket:
    control = ctx.socket(zmq.DEALER)
    control.connect(f"tcp://127.0.0.1:{srv.ports['control']}")
    welcome = _request(control, wire.Register(1, producer_id, "h", 1, "fake", -1))
    assert isinstance(welcome, wire.Welcome)
    return control


def _reply(sock: zmq.Socket) -> wire.Message:
    assert sock.poll(10_000), "no reply from the server"
    return wire.decode(sock.recv(), wire.Limits())


@pytest.mark.parametrize("server", [["net.lease_wait_s=5"]], indirect=True)
def test_a_starved_lease_request_waits_and_gets_its_grant_when_leases_free_up(server, tmp_path):
    srv, ctx = server
    a, b = _connect(srv, ctx, "a"), _connect(srv, ctx, "b")
    a.send(wire.encode(wire.LeaseRequest(2, "a", 4, -1)))  # nothing published yet: parked
    assert not a.poll(200), "answered although no lease could be granted"
    srv.announce_snapshot(wire.SnapshotInfo(0, 1, "00", str(tmp_path / "none")))
    (first,) = _reply(a).leases  # pushed the moment the snapshot was published
    b.send(wire.encode(wire.LeaseRequest(2, "b", 4, 0)))  # the one lease of step 0 is a's
    a.send(wire.encode(wire.LeaseRequest(3, "a", 3, 0)))  # parked behind b
    assert not b.poll(200)
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{srv.ports['rollouts']}")
    push.send(wire.encode(dataclasses.replace(_group(first, [1.0, 0.0]), producer_id="a")))
    got = srv.next_group(timeout_s=10)
    srv.settle_trained([got], trained_step=0)
    assert not b.poll(200), "granted before the step's snapshot was published"
    srv.announce_snapshot(wire.SnapshotInfo(1, 1, "01", str(tmp_path / "none")))
    grant = _reply(b)  # first come, first served: b asked first and takes step 1's lease
    assert [lease.step for lease in grant.leases] == [1]
    assert not a.poll(200)
    srv.stop_granting()  # the end of the run answers a parked request at once
    last = _reply(a)
    assert (last.req, last.leases, last.status.finished) == (3, (), True)
    counters = srv.view()["counters"]
    assert counters["lease_replies_parked"] == 3
    assert counters["lease_replies_empty"] == 1
    for sock in (a, b, push):
        sock.close(linger=0)


@pytest.mark.parametrize("server", [["net.lease_wait_s=0.3"]], indirect=True)
def test_a_parked_lease_request_is_answered_empty_after_the_wait_and_a_newer_replaces_it(server):
    srv, ctx = server
    a = _connect(srv, ctx, "a")
    a.send(wire.encode(wire.LeaseRequest(2, "a", 1, -1)))
    a.send(wire.encode(wire.LeaseRequest(3, "a", 1, -1)))  # the older one is answered at once
    assert (_reply(a).req, _reply(a).req) == (2, 3)  # ... and the newer after net.lease_wait_s
    assert srv.view()["counters"]["lease_replies_empty"] == 2
    a.close(linger=0)


@pytest.mark.parametrize("server", [["net.lease_wait_s=0.3"]], indirect=True)
def test_a_request_that_asks_to_wait_longer_stays_parked_past_the_consumers_own_wait(
    server, tmp_path
):
    """A crowd's request (`wait_s`, common/net/heartbeat.py) waits its own time: b, parked first
    for 600 s, is still waiting when a, parked after it for net.lease_wait_s, is answered."""
    srv, ctx = server
    a, b = _connect(srv, ctx, "a"), _connect(srv, ctx, "b")
    b.send(wire.encode(wire.LeaseRequest(2, "b", 1, -1, wait_s=600.0)))
    assert not b.poll(200)  # parked before a: a's empty reply below cannot come first by order
    a.send(wire.encode(wire.LeaseRequest(2, "a", 1, -1)))
    assert _reply(a).leases == ()  # after net.lease_wait_s
    assert not b.poll(500), "answered at net.lease_wait_s, not at the wait it asked for"
    srv.announce_snapshot(wire.SnapshotInfo(0, 1, "00", str(tmp_path / "none")))
    assert len(_reply(b).leases) == 1  # still waiting, so the lease freed up is b's at once
    for sock in (a, b):
        sock.close(linger=0)


@pytest.mark.parametrize(
    "server", [["net.lease_wait_s=5", "train.prompts_per_step=5"]], indirect=True
)
def test_producers_waiting_together_share_the_leases_that_free_up(server, tmp_path):
    srv, ctx = server
    socks = {p: _connect(srv, ctx, p) for p in ("a", "b", "c")}
    for p in ("a", "b", "c"):  # nothing published: all three wait, a first
        socks[p].send(wire.encode(wire.LeaseRequest(2, p, 4 if p != "c" else 1, -1)))
    assert not socks["a"].poll(200)
    srv.announce_snapshot(wire.SnapshotInfo(0, 1, "00", str(tmp_path / "none")))
    counts = {p: len(_reply(sock).leases) for p, sock in socks.items()}
    assert counts == {"a": 2, "b": 2, "c": 1}  # one each in turn: not all five to a
    for sock in socks.values():
        sock.close(linger=0)


def test_leases_a_producer_drops_at_the_end_of_the_run_end_as_shutdown(server, tmp_path):
    srv, ctx = server
    a = _connect(srv, ctx, "a")
    srv.announce_snapshot(wire.SnapshotInfo(0, 1, "00", str(tmp_path / "none")))
    (lease,) = _request(a, wire.LeaseRequest(2, "a", 1, 0)).leases
    srv.stop_granting()  # the producer hears it and leaves without running its lease
    assert _request(a, wire.Goodbye(3, "a", ())).status.finished
    srv.flush_ledger()
    (record,) = RF.read_leases(tmp_path)
    assert (record.lease_id, record.state, record.reason) == (lease.lease_id, "expired", "shutdown")
    assert srv.balance().ok
    a.close(linger=0)


def test_registrations_beyond_the_producer_records_kept_are_refused(server, monkeypatch):
    import consumer.server.control

    srv, ctx = server
    monkeypatch.setattr(consumer.server.control, "MAX_PRODUCERS", 2)
    a, b = _connect(srv, ctx, "a"), _connect(srv, ctx, "b")
    c = ctx.socket(zmq.DEALER)
    c.connect(f"tcp://127.0.0.1:{srv.ports['control']}")
    refused = _request(c, wire.Register(1, "c", "h", 1, "fake", -1))
    assert isinstance(refused, wire.Reject)
    assert refused.reason == "too_many_producers"
    assert isinstance(_request(a, wire.Register(2, "a", "h", 1, "fake", -1)), wire.Welcome)
    assert srv.view()["counters"]["control_rejected.too_many_producers"] == 1
    for sock in (a, b, c):
        sock.close(linger=0)


@pytest.mark.parametrize(
    "server", [["net.producer_timeout_s=0.2", "net.heartbeat_s=0.05"]], indirect=True
)
def test_a_producer_the_server_forgets_takes_its_fetch_records_along(server, monkeypatch):
    import consumer.server.loop

    srv, ctx = server
    monkeypatch.setattr(consumer.server.loop, "_FORGET_AFTER_S", 0.0)  # then 10 x 0.2 s
    r = _connect(srv, ctx, "r")
    relay = wire.Source("tcp://10.0.0.3:6000", "")
    _request(r, wire.FetchRequest(2, "r", 5, -1, "", relay))  # not kept: refused, relay noted
    fanout = srv._control._fanout
    bad = (wire.BadSource(relay.endpoint, "stalled"),)
    _request(r, wire.FetchDone(3, "r", 5, "weights", False, 0, bad, False))
    assert fanout._relays
    assert fanout._bad
    _request(r, wire.Goodbye(4, "r", ()))
    _wait(lambda: "r" not in srv.view()["producers"], "r forgotten")
    _wait(lambda: not fanout._relays and not fanout._bad, "r's fetch records dropped")
    r.close(linger=0)


def test_a_server_stopped_before_it_started_closes_its_sockets(tmp_path):
    """A learner that fails between building its server and starting it must not leak the
    sockets (nor the wake-up socket pair: an unclosed one surfaced as a ResourceWarning at some
    later test's garbage collection)."""
    cfg = C.apply_overrides(C.Config(), ["net.control_port=0"])
    ctx = zmq.Context()
    spec = run_spec(cfg, vocab_size=32, model="")
    srv = Server(
        cfg, ctx, prompts=make_source(cfg.task, seed=0), spec=spec, run_dir=tmp_path, keys=None
    )
    srv.stop()
    loop = srv._loop  # the thread that owns the sockets never ran
    for sock in (loop._control.sock, loop._rollouts, loop._announce):
        assert sock.closed
    for end in (loop._calls._wake_recv, loop._calls._wake_send):
        assert end.fileno() == -1
    ctx.term()  # returns only once every socket of the context is closed


@pytest.mark.parametrize("server", [["net.max_heartbeats_per_s=0.1"]], indirect=True)
def test_the_heartbeat_period_replies_name_grows_with_live_producers_and_the_timeout_with_it(
    server,
):
    srv, ctx = server  # net.heartbeat_s = 1, net.producer_timeout_s = 30
    assert srv.heartbeat_timing() == (1.0, 30.0)
    socks, periods = [], []
    for i in range(4):
        control = ctx.socket(zmq.DEALER)
        control.connect(f"tcp://127.0.0.1:{srv.ports['control']}")
        welcome = _request(control, wire.Register(1, f"p{i}", "h", 1, "fake", -1))
        periods.append(welcome.status.heartbeat_s)
        socks.append(control)
    assert periods == [10.0, 20.0, 30.0, 40.0]  # live producers / 0.1 per second
    beat = _request(socks[0], wire.Heartbeat(2, "p0", -1, "idle", 0))
    assert beat.status.heartbeat_s == 40.0
    assert srv.heartbeat_timing() == (40.0, 3 * 40.0)  # silences of 3 periods
    _request(socks[3], wire.Goodbye(3, "p3"))  # one left: fewer beats are asked for ...
    assert _request(socks[0], wire.Heartbeat(4, "p0", -1, "idle", 0)).status.heartbeat_s == 30.0
    assert srv.heartbeat_timing()[0] == 40.0  # ... but those who heard 40 s may still sleep it
    for sock in socks:
        sock.close(linger=0)


@pytest.mark.parametrize("server", [["net.heartbeat_s=2"]], indirect=True)
def test_a_few_producers_are_asked_for_the_configured_period_never_less(server):
    srv, ctx = server
    control = _connect(srv, ctx, "p")
    assert _request(control, wire.Heartbeat(2, "p", -1, "idle", 0)).status.heartbeat_s == 2.0
    control.close(linger=0)


@pytest.mark.parametrize("server", [("train.prompts_per_step=2",)], indirect=True)
def test_a_zero_variance_group_frees_its_lease_on_arrival_while_the_learner_is_busy(
    server, tmp_path
):
    """Its lease ends as it arrives, so its slot is granted again before the learner (busy with
    a step) takes the group from its queue; the learner's drop of it later changes nothing."""
    srv, ctx = server
    control = _connect(srv, ctx, "p")
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{srv.ports['rollouts']}")
    srv.announce_snapshot(wire.SnapshotInfo(0, 1, "00", str(tmp_path / "none")))
    grant = _request(control, wire.LeaseRequest(2, "p", 4, 0))
    assert len(grant.leases) == 2  # every slot the bound allows
    same, mixed = grant.leases
    push.send(wire.encode(_group(same, [1.0, 1.0])))
    push.send(wire.encode(_group(mixed, [1.0, 0.0])))
    regrant = _wait(
        lambda: _request(control, wire.LeaseRequest(3, "p", 4, 0)).leases, "a lease regranted"
    )
    assert len(regrant) == 1  # the zero-variance group's slot, the learner not having looked
    first = srv.next_group(timeout_s=10)
    assert first is not None
    assert first.lease_id == same.lease_id
    assert srv.settled_on_arrival(first)
    srv.drop(first, "dropped_zero_variance")  # the learner's drop: already done
    second = srv.next_group(timeout_s=10)
    assert second is not None
    assert not srv.settled_on_arrival(second)
    srv.settle_trained([second], trained_step=0)
    srv.stop_granting()
    srv.expire_open("shutdown")
    balance = srv.balance()
    assert balance.ok
    assert (balance.dropped_zero_variance, balance.trained) == (1, 1)
    control.close(linger=0)
    push.close(linger=0)
