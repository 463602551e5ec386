"""Per-producer state on disk, off the optimizer step's path.

The per-step metrics line holds aggregates only (how many producers, by state); what each
producer reports goes to two files of the run directory (common/run_files.py's records),
written by the consumer's network thread every `every_s` seconds (not per step), so a step costs
the same at 1 and 1,000 producers:
- `producers.json` (`ProducersFile`): the newest `ProducerStatus` of every producer the consumer
  knows, rewritten whole, atomically, when anything changed since the last write;
- `producers.jsonl` (`ProducerChange` lines): one line each time a producer's loaded weight
  version or state has changed since the last write (the history that `asyncgrpo report`
  plots; at most one line per producer per write).
Readers use common/run_files.py (`read_producers`, `read_producer_history`, `latest_producers`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from common import run_files as RF


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


def aggregate(producers: Mapping[str, View]) -> Census:
    states = Counter(v.state for v in producers.values())
    live = sum(n for s, n in states.items() if s not in ("gone", "left"))
    return Census(live, dict(sorted(states.items())))


def status_of(view: View) -> RF.ProducerStatus:
    """A producer's line of producers.json."""
    return RF.ProducerStatus(
        host=view.host, pid=view.pid, engine=view.engine, version=view.loaded_version,
        state=view.state, num_in_flight=view.num_in_flight, counters=dict(view.counters),
    )  # fmt: skip


class Roster:
    """Writes `producers.json` / `producers.jsonl` of `run_dir`; call `maybe_write` often (it
    writes at most every `every_s` seconds) and `write` to force one (at the end of a run)."""

    def __init__(self, run_dir: Path, *, every_s: float = 2.0) -> None:
        self.run_dir, self.every_s = run_dir, every_s
        self._next = 0.0  # monotonic time of the next write
        self._last: dict[str, tuple[int, str]] = {}  # producer -> (version, state) last written
        self._current: dict[str, RF.ProducerStatus] = {}  # the last producers.json content
        self.census = Census()

    def maybe_write(self, producers: Mapping[str, View], now: float) -> bool:
        """Write if `every_s` has passed since the last write; True when it did."""
        if now < self._next:
            return False
        self._next = now + self.every_s
        self.write(producers)
        return True

    def write(self, producers: Mapping[str, View]) -> None:
        unix = time.time()
        current = {p: status_of(v) for p, v in producers.items()}
        self.census = aggregate(producers)
        changed = [
            p for p, v in producers.items() if self._last.get(p) != (v.loaded_version, v.state)
        ]
        RF.append_producer_changes(
            self.run_dir,
            (RF.ProducerChange(unix_time=unix, producer=p, version=producers[p].loaded_version,
                               state=producers[p].state) for p in changed),
        )  # fmt: skip
        for p in changed:
            self._last[p] = (producers[p].loaded_version, producers[p].state)
        for p in set(self._last) - set(producers):  # forgotten by the consumer
            del self._last[p]
        if current != self._current:
            RF.write_producers(self.run_dir, RF.ProducersFile(unix_time=unix, producers=current))
            self._current = current
