"""Progress of long work, said in plain lines (a log file, a pipe, a terminal alike).

Every slow phase a user waits through says how far it has got: the demo model's build, the
final evaluation, a replay, `make-model`, a run's progress lines. The rule, one place
(`Ticker`): a line every `every_s` seconds (10), at the first unit of work, and each time the
work passes another tenth of its total, so a fast job of 300 units says ten lines, not two,
and a slow one never goes quiet for more than 10 s.

- `Ticker(total, started)`: `due(done, now)` says whether a line is due (and counts it said);
  a total of 0 is unknown (time and the first unit only).
- `Counter(what, total, say)`: call it with the units done; it says
  `building the demo model: 300/900 warm-up steps (33%), 10 s` when the ticker says.
- `heartbeat(what, say)`: for a phase that cannot count (a library's load), a thread saying
  `converting the GGUF file… 20 s` every 10 s until the block ends.
Pure but for the clock and the thread; `say` is the caller's (stderr, a logger).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

EVERY_S = 10.0


@dataclass
class Ticker:
    """When the next progress line is due (module docstring)."""

    total: int
    started: float  # monotonic
    every_s: float = EVERY_S
    said_at: float = field(init=False)
    said_done: int = 0

    def __post_init__(self) -> None:
        self.said_at = self.started

    def due(self, done: int, now: float) -> bool:
        """True when a line should go out now (and it is then counted as said)."""
        tenth = max(self.total // 10, 1) if self.total > 0 else 0
        crossed = bool(tenth) and done // tenth > self.said_done // tenth
        first = done > 0 and self.said_done == 0
        if now - self.said_at >= self.every_s or crossed or first:
            self.said_at, self.said_done = now, done
            return True
        return False


@dataclass
class Counter:
    """Says `WHAT: DONE/TOTAL UNIT (P%), S s` when its `Ticker` says (module docstring)."""

    what: str
    total: int
    say: Callable[[str], None]
    unit: str = ""
    clock: Callable[[], float] = time.monotonic
    ticker: Ticker = field(init=False)

    def __post_init__(self) -> None:
        self.ticker = Ticker(self.total, self.clock())

    def __call__(self, done: int) -> None:
        now = self.clock()
        if self.ticker.due(done, now):
            unit = f" {self.unit}" if self.unit else ""
            share = f" ({done / self.total:.0%})" if self.total else ""
            took = now - self.ticker.started
            self.say(f"{self.what}: {done}/{self.total}{unit}{share}, {took:.0f} s")


@contextmanager
def heartbeat(what: str, say: Callable[[str], None], every_s: float = EVERY_S) -> Iterator[None]:
    """Say `WHAT… N s` every `every_s` seconds while the block runs (a daemon thread)."""
    stop = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not stop.wait(every_s):
            say(f"{what}… {time.monotonic() - started:.0f} s")

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
