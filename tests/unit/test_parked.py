"""Parked lease requests (consumer/server/parked.py) without sockets: first come, first served
through any number of replaced and answered requests, overdue ones by their own deadlines, and
indexes whose size follows the requests parked, not the requests ever parked."""

from __future__ import annotations

import threading
from collections import Counter
from types import SimpleNamespace

from common import wire
from common.files.net_stats import LoopTiming
from consumer.server.parked import ParkedRequests


def parked_requests(free: list[int]) -> tuple[ParkedRequests, list[tuple[str, int, tuple]]]:
    """Requests granted from the lease ids in `free` (one per call, while any remain), and the
    replies sent: (producer, request id, lease ids)."""
    counters: Counter[str] = Counter()
    state = SimpleNamespace(
        lock=threading.Lock(), counters=counters, timing=LoopTiming(), accepting=True,
        status=lambda producer_id: wire.Status("r", 0, None),
        count=lambda key, n=1: counters.update({key: n}),
    )  # fmt: skip
    sent: list[tuple[str, int, tuple]] = []

    def grant(msg: wire.LeaseRequest, now: float, limit: int) -> tuple[wire.Lease, ...]:
        if not free:
            return ()
        return (wire.Lease(free.pop(0), 0, 0, 0, "p", "a", (), ""),)

    def reply(identity: bytes, msg: wire.Message) -> None:
        assert isinstance(msg, wire.LeaseGrant)
        sent.append((identity.decode(), msg.req, tuple(lease.lease_id for lease in msg.leases)))

    return ParkedRequests(state, grant=grant, reply=reply), sent  # type: ignore[arg-type]


def request(producer: str, req: int, max_leases: int = 1) -> wire.LeaseRequest:
    return wire.LeaseRequest(req, producer, max_leases, 0)


def test_leases_that_free_up_go_first_come_first_served_through_many_replaced_requests():
    free: list[int] = []
    parked, sent = parked_requests(free)
    for round_ in range(50):  # every producer asks again and again: old entries pile up
        for i in range(40):
            parked.unpark(f"p{i:02d}")
            parked.park(f"p{i:02d}".encode(), request(f"p{i:02d}", round_), 1e9)
    assert len(sent) == 49 * 40  # each newer request answered the older empty
    assert len(parked._queue) <= 2 * 40 + 65  # rebuilt, not 2,000 entries
    sent.clear()
    free.extend(range(5))
    parked.serve(now=0.0)
    assert sent == [(f"p{i:02d}", 49, (i,)) for i in range(5)]  # the five parked first


def test_overdue_requests_are_answered_by_their_own_deadline_not_their_order():
    parked, sent = parked_requests([])
    parked.park(b"long", request("long", 1), 600.0)  # a crowd's wait, parked first
    parked.park(b"short", request("short", 1), 2.0)
    parked.serve(now=3.0)
    assert sent == [("short", 1, ())]
    parked.serve(now=601.0)
    assert sent[-1] == ("long", 1, ())
    assert not parked


def test_a_request_for_several_leases_gets_one_each_turn_and_a_request_for_one_is_not_held_back():
    free = list(range(4))
    parked, sent = parked_requests(free)
    parked.park(b"a", request("a", 1, max_leases=3), 1e9)
    parked.park(b"b", request("b", 1, max_leases=1), 1e9)
    parked.serve(now=0.0)
    assert sent == [("b", 1, (1,)), ("a", 1, (0, 2, 3))]  # b's grant is sent before a's ends
