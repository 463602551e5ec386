"""Lease requests that wait at the consumer for leases to free up, on the network thread.

A lease request that cannot be granted is parked, not answered empty: it gets its grant the
moment leases free up (a step settled, a snapshot published, a lease dropped or expired: the
loop calls `serve` after every event), or an empty reply once its wait is over
(`net.lease_wait_s`, or longer when the producer asked to wait longer: `LeaseRequest.wait_s`,
a crowd of starved producers, common/net/heartbeat.py), or a finished one when the run ends.
Parked requests are served first come, first served (one per producer: a newer one answers the
older empty, `unpark`), so a starved producer costs one request per wait, not one per round
trip. Serving them costs one lease-book query when nothing is free and one heap look-up for
the overdue, whatever their number: nothing in `serve` walks all of them.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from common import wire
from consumer.server.state import NetState

# (request, now, at most this many leases) -> the leases granted, maybe none
Grant = Callable[[wire.LeaseRequest, float, int], tuple[wire.Lease, ...]]


@dataclass(slots=True)
class _Parked:
    """A lease request waiting for leases: who asked (ROUTER identity) and what (until when:
    its entry in `ParkedRequests._deadlines`)."""

    identity: bytes
    msg: wire.LeaseRequest


class ParkedRequests:
    """The parked lease requests by producer id, oldest first; `grant` cuts leases for one and
    `reply` sends a reply over the control socket to a ROUTER identity.

    Two lazy indexes over `_parked` find what `serve` needs without walking it: the order of
    parking (a deque) and the deadlines (a heap). An entry that is no longer the request parked
    for its producer (answered, dropped, replaced) is skipped where it surfaces, and both are
    rebuilt once such entries outnumber the live ones."""

    def __init__(
        self, state: NetState, *, grant: Grant, reply: Callable[[bytes, wire.Message], None]
    ) -> None:
        self._state, self._grant, self._reply = state, grant, reply
        self._parked: dict[str, _Parked] = {}
        self._queue: deque[tuple[str, _Parked]] = deque()  # oldest first
        self._deadlines: list[tuple[float, int, str, _Parked]] = []  # (deadline, order, ...)
        self._order = itertools.count()

    def __bool__(self) -> bool:
        return bool(self._parked)

    def park(self, identity: bytes, msg: wire.LeaseRequest, deadline: float) -> None:
        """Park `msg` until `deadline` (monotonic seconds) at the latest (its producer's older
        request, if any, must be answered first: `unpark`)."""
        parked = _Parked(identity, msg)
        self._parked[msg.producer_id] = parked
        self._queue.append((msg.producer_id, parked))
        heapq.heappush(self._deadlines, (deadline, next(self._order), msg.producer_id, parked))
        if len(self._queue) > 2 * len(self._parked) + 64:  # mostly answered entries: rebuild
            self._queue = deque(e for e in self._queue if self._is_parked(*e))
            self._deadlines = [e for e in self._deadlines if self._is_parked(e[2], e[3])]
            heapq.heapify(self._deadlines)

    def _is_parked(self, producer_id: str, parked: _Parked) -> bool:
        return self._parked.get(producer_id) is parked

    def drop(self, producer_id: str) -> None:
        """Forget `producer_id`'s parked request unanswered (it is gone: nobody to answer)."""
        self._parked.pop(producer_id, None)

    def unpark(self, producer_id: str) -> None:
        """Answer `producer_id`'s parked lease request, if any, empty."""
        parked = self._parked.pop(producer_id, None)
        if parked is not None:
            self._answer(producer_id, parked, ())

    def _answer(self, producer_id: str, parked: _Parked, leases: tuple[wire.Lease, ...]) -> None:
        st = self._state
        st.count("lease_replies_parked")
        if not leases:
            st.count("lease_replies_empty")
        status = st.status(producer_id)
        self._reply(parked.identity, wire.LeaseGrant(parked.msg.req, leases, status))
        if leases:  # common/files/net_stats.py: from the turn that freed them to the reply sent
            st.timing.lease_parked_grant.record(time.perf_counter() - st.timing.turn_start)
        st.timing.served()  # a producer answered: the stretch without one ends

    def serve(self, now: float) -> None:
        """Grant parked requests while leases are free, one lease each in turn, oldest first
        (producers waiting together share the leases that free up, rather than the first
        taking them all), each answered as soon as its grant is complete; answer the overdue
        ones empty, and all of them once the run is finished. A grant does not depend on who
        asks, so the first that gets nothing ends it."""
        if not self._state.accepting:
            for producer_id, parked in list(self._parked.items()):
                del self._parked[producer_id]
                self._answer(producer_id, parked, ())
            return
        got: dict[str, list[wire.Lease]] = {}  # granted some, wanting more
        exhausted = False
        while self._queue and not exhausted:  # the first turn, oldest first
            producer_id, parked = self._queue[0]
            if not self._is_parked(producer_id, parked):
                self._queue.popleft()
                continue
            lease = self._grant(parked.msg, now, 1)
            if not lease:
                exhausted = True
                break
            self._queue.popleft()
            if parked.msg.max_leases > 1:
                got[producer_id] = list(lease)
            else:  # its grant is complete: answered now, not after everyone else's
                del self._parked[producer_id]
                self._answer(producer_id, parked, lease)
        wanting = list(got)
        while wanting and not exhausted:  # further turns for those that asked for more
            more = []
            for producer_id in wanting:
                parked = self._parked[producer_id]
                lease = self._grant(parked.msg, now, 1)
                if not lease:
                    exhausted = True
                    break
                got[producer_id].extend(lease)
                if len(got[producer_id]) < parked.msg.max_leases:
                    more.append(producer_id)
            wanting = more
        for producer_id, leases in got.items():
            self._answer(producer_id, self._parked.pop(producer_id), tuple(leases))
        heap = self._deadlines
        while heap and (heap[0][0] <= now or not self._is_parked(heap[0][2], heap[0][3])):
            _, _, producer_id, parked = heapq.heappop(heap)
            if self._is_parked(producer_id, parked):  # overdue, not answered otherwise
                del self._parked[producer_id]
                self._answer(producer_id, parked, ())
