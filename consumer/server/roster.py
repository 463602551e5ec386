"""Per-producer state on disk, off the optimizer step's path.

The per-step metrics line holds aggregates only (how many producers, by state); what each
producer reports goes to two files of the run directory (common/files/run_files.py's records),
written every few seconds (not per step) on the books' writer thread from the statuses the
network thread noted as they changed (consumer/server/state.py `note`), so neither a step nor the
network thread's housekeeping costs more at 1,000 producers than at 1:
- `producers.json` (`ProducersFile`): the newest `ProducerStatus` of every producer the consumer
  knows, rewritten whole, atomically, when anything changed since the last write;
- `producers.jsonl` (`ProducerChange` lines): one line each time a producer's loaded weight
  version or state has changed since the last write (the history that `asyncgrpo report`
  plots; at most one line per producer per write).
Readers use common/files/run_files.py (`read_producers`, `read_producer_history`,
`latest_producers`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from common.files import run_files as RF


class Stated(Protocol):
    """Anything with a producer's `state` (a view, or a `ProducerStatus`)."""

    @property
    def state(self) -> str: ...


class View(Protocol):
    """What the consumer knows of one producer (consumer/server/state.py's ProducerView)."""

    host: str
    pid: int
    engine: str
    loaded_version: int
    state: str
    num_in_flight: int
    counters: dict[str, float]


@dataclass(frozen=True, slots=True)
class Census:
    """The per-step summary of the producers: `live` (not gone or left) and `by_state`."""

    live: int = 0
    by_state: dict[str, int] = field(default_factory=dict)


def aggregate(producers: Mapping[str, Stated]) -> Census:
    states = Counter(v.state for v in producers.values())
    live = sum(n for s, n in states.items() if s not in ("gone", "left"))
    return Census(live, dict(sorted(states.items())))


def status_of(view: View) -> RF.ProducerStatus:
    """A producer's line of producers.json (its counters held, not copied: they are the last
    heartbeat's decoded mapping, which nobody changes)."""
    return RF.ProducerStatus(
        host=view.host,
        pid=view.pid,
        engine=view.engine,
        version=view.loaded_version,
        state=view.state,
        num_in_flight=view.num_in_flight,
        counters=view.counters,
    )


class Roster:
    """Writes `producers.json` / `producers.jsonl` of `run_dir` from the statuses it is given:
    `apply` the ones that changed (None: forgotten), then `write` (on the books' writer thread,
    consumer/server/book_writer.py). `census` is the producers by state as of the last write."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._current: dict[str, RF.ProducerStatus] = {}  # what producers.json holds next
        self._last: dict[str, tuple[int, str]] = {}  # producer -> (version, state) last written
        self._touched: dict[str, None] = {}  # producers applied since the last write, in order
        self._dirty = False  # producers.json is behind `_current`
        self.census = Census()

    def apply(self, changes: Mapping[str, RF.ProducerStatus | None]) -> None:
        for p, status in changes.items():
            if status is None:
                if self._current.pop(p, None) is not None:
                    self._dirty = True
                self._last.pop(p, None)
            elif self._current.get(p) != status:
                self._current[p] = status
                self._touched[p] = None
                self._dirty = True

    def write(self) -> None:
        """Append the version and state changes to producers.jsonl and rewrite producers.json
        if anything changed since the last write."""
        unix = time.time()
        changes = []
        for p in self._touched:
            status = self._current.get(p)
            if status is not None and self._last.get(p) != (status.version, status.state):
                self._last[p] = (status.version, status.state)
                changes.append(
                    RF.ProducerChange(
                        unix_time=unix, producer=p, version=status.version, state=status.state
                    )
                )
        self._touched = {}
        RF.append_producer_changes(self.run_dir, changes)
        if self._dirty:
            RF.write_producers(
                self.run_dir, RF.ProducersFile(unix_time=unix, producers=dict(self._current))
            )
            self._dirty = False
        self.census = aggregate(self._current)
