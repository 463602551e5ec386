"""What the producer's tasks share on its one event loop: the consumer's run as last heard of,
the leases in flight, the counters, and a change counter to wait on.

`State` is written by the status handling (run id, newest snapshot, finished), the lease tasks
(in flight, the pins of eval groups), the weights keeper (the run whose weights the engine holds,
a reload running) and everyone who counts;
every change the others may be waiting for is followed by `changed.bump()`. All of it runs on the
producer's event loop: no locks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from common import wire


class Changes:
    """A change counter that coroutines can wait on without missing a change (no clear races)."""

    def __init__(self) -> None:
        self.count = 0
        self._event = asyncio.Event()

    def bump(self) -> None:
        self.count += 1
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seen: int, timeout_s: float) -> None:
        """Return once `count != seen`, or after `timeout_s`."""
        if self.count != seen:
            return
        try:
            async with asyncio.timeout(timeout_s):  # unlike wait_for, never swallows a cancel
                await self._event.wait()
        except TimeoutError:
            pass

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Return once `predicate()` holds (checked at each change), or after `timeout_s`.
        Unlike `wait`, changes that leave it false do not end the wait."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await self.wait(self.count, left)


@dataclass
class State:
    """One producer's view of its consumer's run, shared by its tasks."""

    producer_id: str
    run_id: str = ""
    target: wire.SnapshotInfo | None = None  # newest snapshot the consumer has announced
    weights_run: str = ""  # run id of the consumer whose snapshot the engine holds
    finished: bool = False
    heartbeat_s: float = 1.0  # the period the consumer last asked for (`Status.heartbeat_s`)
    in_flight: set[int] = field(default_factory=set)
    # evaluation leases (consumer/evaluation/rounds.py): the eval groups being sampled pin the
    # loaded weights (no reload starts while pins > 0: producer/weights.py), `loading` is True
    # while a reload runs, and the eval leases given back unsampled leave with the next request
    pins: int = 0
    loading: bool = False
    declined: list[int] = field(default_factory=list)
    # the version the consumer's eval round still leases for (`Status.eval_version`), and
    # whether this producer pins its weights for that round (it holds that version)
    eval_round: int = -1
    eval_from: int = -1  # `Status.eval_from`: a round without a version yet, from this one
    round_pinned: bool = False
    counters: dict[str, float] = field(default_factory=dict)
    changed: Changes = field(default_factory=Changes)  # version, acks, target or in-flight moved

    def count(self, key: str, n: float = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n
