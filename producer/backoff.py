"""Jittered exponential back-off: how long a producer that got nothing waits before asking again.

The n-th consecutive wait (n = 0, 1, ...) is drawn uniformly from [b/2, b] with
`b = min(cap_s, first_s * 2**n)` ("equal jitter"): it grows to the cap while nothing comes, is
never zero (a reply that arrives at once cannot make the caller spin), and is spread, so that
producers started together stop asking together. `reset()` after a success.
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, first_s: float, cap_s: float, rng: random.Random) -> None:
        assert 0 < first_s <= cap_s, (first_s, cap_s)
        self.first_s, self.cap_s, self.rng = first_s, cap_s, rng
        self.attempts = 0

    def next_s(self) -> float:
        """The next wait in seconds, in [b/2, b]; each call doubles b up to `cap_s`."""
        bound = min(self.cap_s, self.first_s * 2.0 ** min(self.attempts, 60))
        self.attempts += 1
        return self.rng.uniform(bound / 2, bound)

    def reset(self) -> None:
        self.attempts = 0
