"""Backpressure: how many groups (and bytes) the consumer holds for the learner, and which
finished groups producers hold for it meanwhile.

An admitted group waits in the queue until the learner takes it (`get`). The queue is bounded
twice: at most `max_bytes` (encoded message bytes: a decoded group is zero-copy views of its
message) and at most `max_groups` groups. A valid group that arrives when it would not fit is
not admitted: its producer is told to hold it (ack `hold`, common/wire/) and the lease is
`held` in the lease book. When the learner has made room, the groups held longest are released
first (ack `send`): room is reserved for each, so that it fits when it comes back, and nothing
that arrives meanwhile overtakes it. Producers thus keep their finished groups, bounded by their
own leases (a held group counts against `producer.max_in_flight`), and ZeroMQ's queues hold only
what producers send once per release: the consumer keeps reading its socket, so they never grow
with a slow learner.

Invariants:
- `queued_bytes + reserved bytes <= max_bytes` and `queued_groups + reserved <= max_groups` at
  every admission; `max_bytes` is at least the largest message (config validation), so every
  group fits an empty queue and nothing waits for ever.
- Held and reserved groups are open leases; `prune` forgets those that ended otherwise (expired
  with their producer, the run's end): their room is given back.
- The queue is the only state shared with the learner's thread (under `_lock`); the rest is the
  network thread's alone.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Container
from dataclasses import dataclass

from common import wire
from common.files.run_files import Backpressure, BackpressureTotals


@dataclass(slots=True)
class _Held:
    producer_id: str
    num_bytes: int
    since: float  # monotonic seconds: first told to hold


class Admission:
    """The learner's bounded queue of admitted groups and the groups producers hold for it."""

    def __init__(self, *, max_bytes: int, max_groups: int) -> None:
        assert max_bytes >= 1, max_bytes
        assert max_groups >= 1, max_groups
        self.max_bytes, self.max_groups = max_bytes, max_groups
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._queue: deque[tuple[wire.Group, int]] = deque()
        self.queued_bytes = self.queued_groups = 0  # under _lock
        self.peak_bytes = self.peak_groups = 0  # since the last `summary(reset=True)`
        self.max_seen_bytes = self.max_seen_groups = 0  # over the whole run
        self._held: OrderedDict[int, _Held] = OrderedDict()  # lease id -> held, oldest first
        self._reserved: dict[int, tuple[int, float]] = {}  # lease id -> (bytes, held since)
        self._reserved_bytes = 0
        self.num_holds = 0  # times a producer was told to hold a group
        self.num_released = 0
        self.num_admitted_after_hold = 0
        self.hold_s_total = self.hold_s_max = 0.0  # told to hold -> admitted

    # -- the learner's thread ------------------------------------------------------------------
    def get(self, timeout_s: float) -> wire.Group | None:
        """The oldest admitted group, or None after `timeout_s` without one."""
        with self._ready:
            if not self._queue and not self._ready.wait_for(lambda: bool(self._queue), timeout_s):
                return None
            group, num_bytes = self._queue.popleft()
            self.queued_bytes -= num_bytes
            self.queued_groups -= 1
            return group

    # -- the network thread --------------------------------------------------------------------
    def offer(self, group: wire.Group, num_bytes: int, *, now: float) -> bool:
        """Admit `group` (True: queued for the learner) or not (False: its producer must hold
        it; the caller tells it). A released group is admitted on its reservation; others
        only when they fit and no held group is waiting for room before them."""
        lease = group.lease_id
        reserved = self._reserved.pop(lease, None)
        if reserved is not None:  # its room is kept for it (unless it grew: then it waits again)
            self._reserved_bytes -= reserved[0]
            if self._fits(num_bytes):
                self._admit(group, num_bytes, held_since=reserved[1], now=now)
                return True
            self._held[lease] = _Held(group.producer_id, num_bytes, reserved[1])
            self._held.move_to_end(lease, last=False)
            self.num_holds += 1
            return False
        held = self._held.get(lease)
        first = held is None or next(iter(self._held)) == lease
        if first and self._fits(num_bytes) and (held is not None or not self._held):
            if held is not None:
                del self._held[lease]
            self._admit(group, num_bytes, held_since=held.since if held else None, now=now)
            return True
        if held is None:
            self._held[lease] = _Held(group.producer_id, num_bytes, now)
        else:
            held.num_bytes = num_bytes
        self.num_holds += 1
        return False

    def release(self) -> list[tuple[str, int]]:
        """(producer id, lease id) of the held groups that fit now, oldest first: room is
        reserved for each; the caller tells their producers to send them."""
        out = []
        while self._held:
            lease, held = next(iter(self._held.items()))
            if not self._fits(held.num_bytes):
                break
            del self._held[lease]
            self._reserved[lease] = (held.num_bytes, held.since)
            self._reserved_bytes += held.num_bytes
            self.num_released += 1
            out.append((held.producer_id, lease))
        return out

    def prune(self, open_leases: Container[int]) -> None:
        """Forget held and reserved groups whose lease is no longer open (it expired with its
        producer, or the run ended): their room is free again."""
        for lease in [k for k in self._held if k not in open_leases]:
            del self._held[lease]
        for lease in [k for k in self._reserved if k not in open_leases]:
            self._reserved_bytes -= self._reserved.pop(lease)[0]

    def summary(self, *, reset: bool = False) -> Backpressure:
        """Metrics: the queue now and its peaks since the last reset, groups producers hold
        for us, how often they were told to hold, and how long a held group waited."""
        with self._lock:
            queued_groups, queued_bytes = self.queued_groups, self.queued_bytes
            peak_groups, peak_bytes = self.peak_groups, self.peak_bytes
            if reset:
                self.peak_bytes, self.peak_groups = self.queued_bytes, self.queued_groups
        admitted_after_hold = self.num_admitted_after_hold
        return Backpressure(
            queued_groups=queued_groups,
            queued_bytes=queued_bytes,
            queued_groups_peak=peak_groups,
            queued_bytes_peak=peak_bytes,
            groups_held=len(self._held) + len(self._reserved),
            holds=self.num_holds,
            hold_s_mean=self.hold_s_total / admitted_after_hold if admitted_after_hold else 0.0,
            hold_s_max=self.hold_s_max,
        )

    def run_summary(self) -> BackpressureTotals:
        """`summary` with the whole run's peaks (`queued_bytes_max`, `queued_groups_max`)
        in place of those since the last reset (for ledger.json)."""
        now = self.summary()
        with self._lock:
            bytes_max, groups_max = self.max_seen_bytes, self.max_seen_groups
        return BackpressureTotals(
            queued_groups=now.queued_groups,
            queued_bytes=now.queued_bytes,
            groups_held=now.groups_held,
            holds=now.holds,
            hold_s_mean=now.hold_s_mean,
            hold_s_max=now.hold_s_max,
            queued_bytes_max=bytes_max,
            queued_groups_max=groups_max,
        )

    def _fits(self, num_bytes: int) -> bool:
        with self._lock:
            return (
                self.queued_bytes + self._reserved_bytes + num_bytes <= self.max_bytes
                and self.queued_groups + len(self._reserved) < self.max_groups
            )

    def _admit(
        self, group: wire.Group, num_bytes: int, *, held_since: float | None, now: float
    ) -> None:
        if held_since is not None:
            waited = now - held_since
            self.num_admitted_after_hold += 1
            self.hold_s_total += waited
            self.hold_s_max = max(self.hold_s_max, waited)
        with self._ready:
            self._queue.append((group, num_bytes))
            self.queued_bytes += num_bytes
            self.queued_groups += 1
            self.peak_bytes = max(self.peak_bytes, self.queued_bytes)
            self.peak_groups = max(self.peak_groups, self.queued_groups)
            self.max_seen_bytes = max(self.max_seen_bytes, self.queued_bytes)
            self.max_seen_groups = max(self.max_seen_groups, self.queued_groups)
            self._ready.notify()
