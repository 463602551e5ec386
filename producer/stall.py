"""A fault for stress tests: one producer stall, at a set time after the producer started.

`producer.stall_after_s` after the producer started (0 = never), for `producer.stall_s`
seconds, every lease that is about to generate waits until the stall is over (counted once per
lease as `stalls`), while heartbeats go on: the consumer sees a producer that holds its leases
and makes no progress. The stress sweeps (`asyncgrpo stress`, setting `stall_s`) and the tests
set it; a run leaves it off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class Stall:
    """The stall window [started + after_s, started + after_s + stall_s) in monotonic seconds;
    `stall_s <= 0` or `after_s <= 0` means no stall."""

    def __init__(
        self, *, after_s: float, stall_s: float, started: float, count: Callable[[str], None]
    ) -> None:
        self.after_s, self.stall_s, self.started = after_s, stall_s, started
        self._count = count

    async def wait(self) -> None:
        """Return at once outside the window; inside it, count a stall and sleep to its end."""
        if self.stall_s > 0 and self.after_s > 0:
            start = self.started + self.after_s
            now = time.monotonic()
            if start <= now < start + self.stall_s:
                self._count("stalls")
                await asyncio.sleep(start + self.stall_s - now)
