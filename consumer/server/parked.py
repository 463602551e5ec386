"""Lease requests that wait at the consumer for leases to free up, on the network thread.

A lease request that cannot be granted is parked, not answered empty: it gets its grant the
moment leases free up (a step settled, a snapshot published, a lease dropped or expired: the
loop calls `serve` after every event), or an empty reply after `net.lease_wait_s`, or a finished
one when the run ends. Parked requests are served first come, first served (one per producer:
a newer one answers the older empty, `unpark`), so a starved producer costs one request per
`net.lease_wait_s`, not one per round trip, and serving them costs one lease-book query when
nothing is free, whatever their number.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from common import wire
from consumer.server.state import NetState

# (request, now, at most this many leases) -> the leases granted, maybe none
Grant = Callable[[wire.LeaseRequest, float, int], tuple[wire.Lease, ...]]


@dataclass(slots=True)
class _Parked:
    """A lease request waiting for leases: who asked (ROUTER identity), what, and until when."""

    identity: bytes
    msg: wire.LeaseRequest
    deadline: float  # monotonic seconds: answered empty then


class ParkedRequests:
    """The parked lease requests by producer id, oldest first; `grant` cuts leases for one and
    `reply` sends a reply over the control socket to a ROUTER identity."""

    def __init__(
        self, state: NetState, *, grant: Grant, reply: Callable[[bytes, wire.Message], None]
    ) -> None:
        self._state, self._grant, self._reply = state, grant, reply
        self._parked: dict[str, _Parked] = {}

    def __bool__(self) -> bool:
        return bool(self._parked)

    def park(self, identity: bytes, msg: wire.LeaseRequest, deadline: float) -> None:
        self._parked[msg.producer_id] = _Parked(identity, msg, deadline)

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
        with st.lock:
            st.counters["lease_replies_parked"] += 1
            if not leases:
                st.counters["lease_replies_empty"] += 1
        status = st.status(producer_id)
        self._reply(parked.identity, wire.LeaseGrant(parked.msg.req, leases, status))
        if leases:  # common/net_stats.py: from the turn that freed them to the reply sent
            st.timing.lease_parked_grant.record(time.perf_counter() - st.timing.turn_start)
        st.timing.served()  # a producer answered: the stretch without one ends

    def serve(self, now: float) -> None:
        """Grant parked requests while leases are free, one lease each in turn, oldest first
        (producers waiting together share the leases that free up, rather than the first
        taking them all); answer the overdue ones empty, and all of them once the run is
        finished. A grant does not depend on who asks, so the first that gets nothing ends it."""
        if not self._state.accepting:
            for producer_id, parked in list(self._parked.items()):
                del self._parked[producer_id]
                self._answer(producer_id, parked, ())
            return
        got: dict[str, list[wire.Lease]] = {}
        wanting, exhausted = list(self._parked), False
        while wanting and not exhausted:
            more = []
            for producer_id in wanting:
                parked = self._parked[producer_id]
                lease = self._grant(parked.msg, now, 1)
                if not lease:
                    exhausted = True
                    break
                mine = got.setdefault(producer_id, [])
                mine.extend(lease)
                if len(mine) < parked.msg.max_leases:
                    more.append(producer_id)
            wanting = more
        for producer_id, leases in got.items():
            self._answer(producer_id, self._parked.pop(producer_id), tuple(leases))
        while self._parked:  # the overdue, oldest first
            producer_id, parked = next(iter(self._parked.items()))
            if now < parked.deadline:
                return  # later ones were parked later: not overdue either
            del self._parked[producer_id]
            self._answer(producer_id, parked, ())
