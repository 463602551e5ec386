"""`netstats.json`: the consumer's network thread timed from inside, for benches and diagnosis.

The network thread (consumer/server/loop.py, control.py) records into a `LoopTiming`:
- `lease_service`: for each lease request answered at once (granted or empty), the seconds from
  taking it off the control socket to its reply sent: the part of a round trip that is the
  consumer's. A parked request (no lease free: consumer/server/parked.py) waits for the learner
  by design; those are counted in `lease_parked`, and a parked request granted leases when they
  free up is timed in `lease_parked_grant` from the start of the loop's turn that freed them
  (the poll's return) to its reply sent.
- `loop_gap`: the stretches in which the network thread neither reads a socket nor answers a
  parked request: from the poll's return, a read or a parked answer to the next one (one
  message's handling), or to the end of the turn (queued calls, housekeeping). The longest is
  the longest time no producer was served. Wall-clock time, so it includes the machine's
  preemption and other threads holding the interpreter lock; `loop_gap_cpu` is the same
  stretches in the network thread's own CPU seconds (what the work cost, whatever else ran).
- `heartbeats`, `lease_requests`, `control_messages` (every request on the control socket):
  counts.

Every hand-over of the books (about every 2 s, consumer/server/books.py) writes a `NetStats`
to the run directory with the process's CPU seconds and the groups trained so far, so a reader
takes two of them and divides: CPU per trained group, per heartbeat, a window's quantiles
(`Histogram.minus`). Histograms are cumulative counts in fixed log-spaced buckets (`BOUNDS_S`,
each 2^(1/8) ≈ 9% above the last, 1 µs to ~100 s); a quantile reads as its bucket's upper
bound, so it errs high by at most 9%. Recording is O(1) (a bisect); nothing grows with anything.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

NET_STATS = "netstats.json"
_HISTOGRAMS = ("lease_service", "lease_parked_grant", "loop_gap", "loop_gap_cpu")
BOUNDS_S: tuple[float, ...] = tuple(1e-6 * 2 ** (i / 8) for i in range(8 * 27))  # to ~134 s


@dataclass(slots=True)
class Histogram:
    """Counts of values (seconds) by bucket: `counts[i]` counts values <= `BOUNDS_S[i]` (and
    above the bound before); the last bucket also takes everything larger."""

    counts: list[int] = field(default_factory=lambda: [0] * len(BOUNDS_S))

    def record(self, seconds: float) -> None:
        self.counts[min(bisect.bisect_left(BOUNDS_S, seconds), len(BOUNDS_S) - 1)] += 1

    def total(self) -> int:
        return sum(self.counts)

    def quantile(self, q: float) -> float | None:
        """The `q` quantile's bucket bound (seconds); None when empty."""
        n = self.total()
        if n == 0:
            return None
        rank, seen = min(n, max(1, int(q * n + 0.999999))), 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return BOUNDS_S[i]
        return BOUNDS_S[-1]

    def max(self) -> float | None:
        """The largest value's bucket bound (seconds); None when empty."""
        return max((BOUNDS_S[i] for i, c in enumerate(self.counts) if c), default=None)

    def minus(self, earlier: Histogram) -> Histogram:
        """What was recorded since `earlier` (a copy of this histogram taken before)."""
        return Histogram([a - b for a, b in zip(self.counts, earlier.counts, strict=True)])

    def copy(self) -> Histogram:
        return Histogram(list(self.counts))


@dataclass(slots=True)
class LoopTiming:
    """What the network thread records (it alone writes it)."""

    lease_service: Histogram = field(default_factory=Histogram)
    lease_parked_grant: Histogram = field(default_factory=Histogram)
    loop_gap: Histogram = field(default_factory=Histogram)
    loop_gap_cpu: Histogram = field(default_factory=Histogram)
    heartbeats: int = 0
    lease_requests: int = 0
    lease_parked: int = 0
    control_messages: int = 0
    turn_start: float = 0.0  # when the poll of the current turn returned (perf_counter, s)
    _wall: float = 0.0  # when the current stretch began (perf_counter, s)
    _cpu: float = 0.0  # and the thread's CPU time then (thread_time, s)

    def resume(self) -> None:
        """The poll returned: a stretch without reading begins."""
        self._wall, self._cpu = time.perf_counter(), time.thread_time()
        self.turn_start = self._wall

    def served(self) -> None:
        """A socket is read, a parked request answered, or the turn ends: the stretch since the
        last call is recorded."""
        wall, cpu = time.perf_counter(), time.thread_time()
        self.loop_gap.record(wall - self._wall)
        self.loop_gap_cpu.record(cpu - self._cpu)
        self._wall, self._cpu = wall, cpu


@dataclass(frozen=True, slots=True, kw_only=True)
class NetStats:
    """One `netstats.json`: a copy of the `LoopTiming` at `unix_time`, with the consumer
    process's CPU seconds (user + system, every thread) and its groups trained so far."""

    unix_time: float
    process_cpu_s: float
    groups_trained: int
    heartbeats: int
    lease_requests: int
    lease_parked: int
    control_messages: int
    lease_service: Histogram
    lease_parked_grant: Histogram
    loop_gap: Histogram
    loop_gap_cpu: Histogram

    @classmethod
    def of(cls, timing: LoopTiming, *, unix_time: float, groups_trained: int) -> Self:
        """A copy of `timing` now (O(number of buckets)); the CPU seconds of this process."""
        t = os.times()
        return cls(
            unix_time=unix_time,
            process_cpu_s=t.user + t.system,
            groups_trained=groups_trained,
            heartbeats=timing.heartbeats,
            lease_requests=timing.lease_requests,
            lease_parked=timing.lease_parked,
            control_messages=timing.control_messages,
            lease_service=timing.lease_service.copy(),
            lease_parked_grant=timing.lease_parked_grant.copy(),
            loop_gap=timing.loop_gap.copy(),
            loop_gap_cpu=timing.loop_gap_cpu.copy(),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "unix_time": self.unix_time,
            "process_cpu_s": self.process_cpu_s,
            "groups_trained": self.groups_trained,
            "heartbeats": self.heartbeats,
            "lease_requests": self.lease_requests,
            "lease_parked": self.lease_parked,
            "control_messages": self.control_messages,
            **{k: getattr(self, k).counts for k in _HISTOGRAMS},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        hist = {k: Histogram([int(c) for c in data[k]]) for k in _HISTOGRAMS}
        if any(len(h.counts) != len(BOUNDS_S) for h in hist.values()):
            raise ValueError("netstats.json: histograms of another bucket layout")
        return cls(
            unix_time=float(data["unix_time"]),
            process_cpu_s=float(data["process_cpu_s"]),
            groups_trained=int(data["groups_trained"]),
            heartbeats=int(data["heartbeats"]),
            lease_requests=int(data["lease_requests"]),
            lease_parked=int(data["lease_parked"]),
            control_messages=int(data["control_messages"]),
            **hist,
        )


def write_net_stats(run_dir: Path, stats: NetStats) -> None:
    """Replace `netstats.json` atomically."""
    tmp = run_dir / f".{NET_STATS}.tmp"
    tmp.write_text(json.dumps(stats.to_json()))
    os.replace(tmp, run_dir / NET_STATS)


def read_net_stats(run_dir: Path) -> NetStats | None:
    """`netstats.json`; None before the first write (or from a consumer without it)."""
    try:
        return NetStats.from_json(json.loads((run_dir / NET_STATS).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
