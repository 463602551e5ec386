"""Jittered exponential back-off: how long a producer that got nothing waits before asking again.

The n-th consecutive wait (n = 0, 1, ...) is drawn uniformly from [b/2, b] with
`b = min(cap_s, first_s * 2**n)` ("equal jitter"): it grows to the cap while nothing comes, is
never zero (a reply that arrives at once cannot make the caller spin), and is spread, so that
producers started together stop asking together. `reset()` after a success.

`follow(period_s, floor_s)` fits it to the heartbeat period before each pause: at its floor
(`floor_s`, net.heartbeat_s) the pauses are as built. A crowd's requests wait at the consumer
for several periods (common/net/heartbeat.py), so the producer passes the floor after those; but a
crowd whose consumer answered at once (net.lease_wait_s = 0) passes the lengthened period, and
the pauses then run from half the period to all of it, so that starved producers together ask
about as often as they heartbeat, whatever their number.
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, first_s: float, cap_s: float, rng: random.Random) -> None:
        assert 0 < first_s <= cap_s, (first_s, cap_s)
        self.first_s, self.cap_s, self.rng = first_s, cap_s, rng
        self._built = (first_s, cap_s)
        self.attempts = 0

    def next_s(self) -> float:
        """The next wait in seconds, in [b/2, b]; each call doubles b up to `cap_s`."""
        bound = min(self.cap_s, self.first_s * 2.0 ** min(self.attempts, 60))
        self.attempts += 1
        return self.rng.uniform(bound / 2, bound)

    def follow(self, period_s: float, floor_s: float) -> bool:
        """Fit the pauses to the heartbeat period `period_s` (its floor: `floor_s`); True when
        the period is lengthened (crowded: a newer snapshot need not cut a pause short)."""
        first_s, cap_s = self._built
        crowded = period_s > floor_s
        self.cap_s = max(cap_s, period_s)
        self.first_s = self.cap_s / 2 if crowded else first_s
        return crowded

    def reset(self) -> None:
        self.attempts = 0
