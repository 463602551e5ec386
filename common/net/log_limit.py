"""Rate-limited logging: a flood of bad messages must not become a flood of log lines.

`LogLimiter.log(key, level, msg, *args)` writes the first line of each `key` at once, then at most
one line per `every_s` seconds for that key, saying how many were held back since the last line.
Keys are short fixed codes chosen by the caller (a rejection reason, an exception type), never
untrusted text, so the table of keys stays small. Counting every event is the caller's job (the
ledger's counters); this only decides which ones reach the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Key:
    last_s: float
    held_back: int = 0


class LogLimiter:
    def __init__(
        self,
        logger: logging.Logger,
        *,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.every_s, self.clock = logger, every_s, clock
        self._keys: dict[str, _Key] = {}

    def log(self, key: str, level: int, msg: str, *args: object, exc_info: bool = False) -> bool:
        """Log `msg % args` unless `key` was logged less than `every_s` ago; True if logged.
        `exc_info` adds the current traceback (for the first line of a key only)."""
        now = self.clock()
        state = self._keys.get(key)
        if state is not None and now - state.last_s < self.every_s:
            state.held_back += 1
            return False
        if state is not None and state.held_back:
            msg += " (and %d more like it in the last %.0f s)"
            args = (*args, state.held_back, now - state.last_s)
        self.logger.log(level, msg, *args, exc_info=exc_info and state is None)
        self._keys[key] = _Key(now)
        return True
