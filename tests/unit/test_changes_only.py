"""The network thread's periodic work costs what changed, not what exists: lease expiry from the
lease book's heap (consumer/server/leases.py) and silence and forgetting from
consumer/server/liveness.py find exactly what a scan of every open lease / every producer finds;
`LeaseBook.take_changed` reports exactly the producers whose counts or open leases moved."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.data.prompts import PromptOrder
from consumer.server.leases import LeaseBook, producer_balanced
from consumer.server.liveness import Liveness

PRODUCERS = ("a", "b", "c", "d")


def scan_expiry(book: LeaseBook, now: float, timeout_s: float, gone: set[str]) -> list[int]:
    """What expiry found when it scanned every open lease (the rule, written out)."""
    return [
        r.lease_id
        for r in book.open.values()
        if (r.state == "issued" and now - r.issued_at > timeout_s)
        or (r.state in ("issued", "held") and r.producer_id in gone)
    ]


def make_book() -> LeaseBook:
    order = PromptOrder(10_000, seed=0, shuffle=False, epochs=0)
    return LeaseBook(order, prompts_per_step=8, max_staleness=3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("gGrhftxpv"), st.integers(0, 1 << 16)), max_size=80))
def test_heap_expiry_finds_what_a_scan_of_every_open_lease_finds(ops):
    book, now, version = make_book(), 0.0, 0
    for op, n in ops:
        producer = PRODUCERS[n % len(PRODUCERS)]
        now += (n % 7) * 0.5
        ids = sorted(book.open)
        pick = ids[n % len(ids)] if ids else None
        if op in "gG":
            book.grant(producer, 1 + n % 5, policy_version=version, published_version=version,
                       now=now)  # fmt: skip
        elif op == "r" and pick is not None and book.open[pick].state in ("issued", "held"):
            book.receive(pick, book.open[pick].producer_id)
        elif op == "h" and pick is not None and book.open[pick].state in ("received", "held"):
            book.hold(pick)
        elif op == "f" and pick is not None and book.open[pick].state == "received":
            book.finalize(pick, "trained")
        elif op == "v":
            version += 1
        elif op == "p":
            held = {i for i in book.open if i % 2}
            book.reconcile(producer, held)
        elif op in "tx":
            gone = {producer} if op == "x" else set()
            expected = scan_expiry(book, now, 3.0, gone)
            got = book.expire(now=now, lease_timeout_s=3.0, gone=gone)
            assert [r.lease_id for r in got] == expected
            assert all(r.state == "expired" for r in got)
            assert scan_expiry(book, now, 3.0, gone) == []
        assert book.holds(producer) == any(r.producer_id == producer for r in book.open.values())
    assert book.balance().ok


def test_expiry_survives_a_restore_and_leaves_delivered_leases_alone():
    book = make_book()
    a = book.grant("a", 3, policy_version=0, published_version=0, now=0.0)
    book.receive(a[0].lease_id, "a")
    restored = make_book()
    restored.load_state_dict(book.state_dict(), now=100.0)  # every open lease issued anew at 100
    assert restored.expire(now=102.0, lease_timeout_s=3.0, gone=set()) == []
    got = restored.expire(now=103.5, lease_timeout_s=3.0, gone=set())
    assert [r.lease_id for r in got] == [r.lease_id for r in a]
    assert book.expire(now=3.5, lease_timeout_s=3.0, gone=set())  # the original: two overdue
    assert set(book.open) == {a[0].lease_id}  # the delivered one stays


def test_take_changed_reports_exactly_the_producers_whose_counts_moved():
    book = make_book()
    book.grant("a", 2, policy_version=0, published_version=0, now=0.0)
    book.grant("b", 1, policy_version=0, published_version=0, now=0.0)
    first = book.take_changed()
    assert set(first) == {"a", "b"}
    assert first["a"] == ({"issued": 2}, 2)
    assert book.take_changed() == {}  # nothing moved since
    lease = next(i for i, r in book.open.items() if r.producer_id == "b")
    book.receive(lease, "b")
    assert book.take_changed() == {}  # a delivery moves no count
    book.finalize(lease, "trained")
    assert book.take_changed() == {"b": ({"issued": 1, "trained": 1}, 0)}
    book.touch("z")  # never held a lease: no ledger entry to rewrite
    assert book.take_changed() == {}
    assert producer_balanced({"issued": 2}, 2)
    assert not producer_balanced({"issued": 2, "trained": 1}, 2)


@pytest.mark.parametrize("seed", range(5))
def test_liveness_finds_what_a_scan_of_every_producer_finds(seed):
    """Random messages, goodbyes, silences and re-registrations of 30 producers: `silent` and
    `due` list what scanning every producer's last-seen and ended-at times lists."""
    rng = random.Random(seed)
    live, last_seen, ended_at = Liveness(), {}, {}  # the scan's books
    now, timeout, after = 0.0, 5.0, 20.0
    for _ in range(2_000):
        now += rng.random()
        p = f"p{rng.randrange(30)}"
        op = rng.random()
        if op < 0.1:
            live.registered(p, now)
            last_seen[p] = now
            ended_at.pop(p, None)
        elif op < 0.7 and p in last_seen:
            live.heard(p, now)
            last_seen[p] = now
        elif op < 0.75 and p in last_seen:
            live.ended(p, now)
            del last_seen[p]
            ended_at[p] = now
        silent = sorted(q for q, t in last_seen.items() if now - t > timeout)
        assert sorted(live.silent(now, timeout)) == silent
        for q in silent:
            del last_seen[q]
            ended_at[q] = now
            live.ended(q, now)
        due = sorted(q for q, t in ended_at.items() if now - t > after)
        assert sorted(live.due(now, after)) == due
        for q in due[: len(due) // 2]:  # some are forgotten, the others wait (a lease held)
            live.forget(q)
            del ended_at[q]
    assert len(live) == len(last_seen)


def test_a_heartbeats_counters_are_held_as_decoded_not_copied(tmp_path):
    """The consumer stores a heartbeat's counters without copying them (a heartbeat costs the
    same whatever its counters), and producers.json gets exactly the last heartbeat's."""
    import zmq

    from common import config as C
    from common import wire
    from consumer.data.prompts import make_source
    from consumer.server.control import Control
    from consumer.server.server import _restored_state
    from consumer.server.wire_terms import run_spec
    from consumer.snapshots.fanout import FanOut

    cfg = C.Config()
    state = _restored_state(cfg, make_source(cfg.task, seed=0), None, 0, False)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    try:
        control = Control(
            state, sock, spec=run_spec(cfg, vocab_size=32, model=""), limits=wire.control_limits(),
            fanout=FanOut(tmp_path, max_children=4, count=state.count),
        )  # fmt: skip
        control.handle(wire.Register(1, "p", "h", 1, "fake", -1), "", b"id")
        for i, uptime in enumerate((1.0, 2.5)):
            data = wire.encode(wire.Heartbeat(2 + i, "p", 0, "idle", 0, {"uptime_s": uptime}))
            beat = wire.decode(data, wire.control_limits())
            assert isinstance(beat, wire.Heartbeat)
            control.handle(beat, "", b"id")
        assert state.producers["p"].counters is beat.counters
        noted = state.roster_changes["p"]
        assert noted is not None
        assert noted.counters is beat.counters
        assert noted.counters == {"uptime_s": 2.5}
    finally:
        sock.close(linger=0)
        ctx.term()
