"""Per-producer state on disk, off the optimizer step's path.

The per-step metrics line holds aggregates only (how many producers, by state); what each
producer reports goes to two files of the run directory, written by the consumer's network
thread every `every_s` seconds (not per step), so a step costs the same at 1 and 1,000
producers:
- `producers.json`: the newest view of every producer the consumer knows (rewritten whole,
  atomically, when anything changed since the last write): `{"unix_time": t, "producers":
  {id: {"host", "pid", "engine", "version", "state", "num_in_flight", "counters"}}}`;
- `producers.jsonl`: one line `{"unix_time", "producer", "version", "state"}` each time a
  producer's loaded weight version or state has changed since the last write (the history that
  `asyncgrpo report` plots; at most one line per producer per write).
`read_current` and `read_history` read them back (empty before the first write).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from common.metrics import StepRecord, read_jsonl

CURRENT_FILE = "producers.json"
HISTORY_FILE = "producers.jsonl"


class View(Protocol):
    """What the consumer knows of one producer (consumer/server/state.py's ProducerView)."""

    host: str
    pid: int
    engine: str
    loaded_version: int
    state: str
    num_in_flight: int
    counters: dict[str, float]


def aggregate(producers: Mapping[str, View]) -> dict[str, Any]:
    """The per-step summary: `producers_live` (not gone or left) and `producers_by_state`."""
    states = Counter(v.state for v in producers.values())
    live = sum(n for s, n in states.items() if s not in ("gone", "left"))
    return {"producers_live": live, "producers_by_state": dict(sorted(states.items()))}


class Roster:
    """Writes `producers.json` / `producers.jsonl` of `run_dir`; call `maybe_write` often (it
    writes at most every `every_s` seconds) and `write` to force one (at the end of a run)."""

    def __init__(self, run_dir: Path, *, every_s: float = 2.0) -> None:
        self.run_dir, self.every_s = run_dir, every_s
        self._next = 0.0  # monotonic time of the next write
        self._last: dict[str, tuple[int, str]] = {}  # producer -> (version, state) last written
        self._current: dict[str, dict[str, Any]] = {}  # the last producers.json content
        self.summary: dict[str, Any] = {"producers_live": 0, "producers_by_state": {}}

    def maybe_write(self, producers: Mapping[str, View], now: float) -> bool:
        """Write if `every_s` has passed since the last write; True when it did."""
        if now < self._next:
            return False
        self._next = now + self.every_s
        self.write(producers)
        return True

    def write(self, producers: Mapping[str, View]) -> None:
        unix = time.time()
        current = {
            p: {
                "host": v.host, "pid": v.pid, "engine": v.engine, "version": v.loaded_version,
                "state": v.state, "num_in_flight": v.num_in_flight, "counters": dict(v.counters),
            }
            for p, v in producers.items()
        }  # fmt: skip
        self.summary = aggregate(producers)
        changed = [
            p for p, v in producers.items() if self._last.get(p) != (v.loaded_version, v.state)
        ]
        if changed:
            with open(self.run_dir / HISTORY_FILE, "a") as f:
                for p in changed:
                    v = producers[p]
                    row = {"unix_time": unix, "producer": p, "version": v.loaded_version}
                    f.write(json.dumps({**row, "state": v.state}) + "\n")
                    self._last[p] = (v.loaded_version, v.state)
        for p in set(self._last) - set(producers):  # forgotten by the consumer
            del self._last[p]
        if current != self._current:
            tmp = self.run_dir / (CURRENT_FILE + ".tmp")
            tmp.write_text(json.dumps({"unix_time": unix, "producers": current}, sort_keys=True))
            tmp.replace(self.run_dir / CURRENT_FILE)
            self._current = current


def read_current(run_dir: Path) -> dict[str, dict[str, Any]]:
    """`producers.json`'s producers ({} before the first write)."""
    try:
        return dict(json.loads((run_dir / CURRENT_FILE).read_text())["producers"])
    except (OSError, ValueError, KeyError):
        return {}


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    """`producers.jsonl`'s lines, oldest first ([] before the first write)."""
    path = run_dir / HISTORY_FILE
    return read_jsonl(path) if path.exists() else []


def latest_views(run_dir: Path, last: StepRecord | None = None) -> dict[str, dict[str, Any]]:
    """{producer: {"version", "state", "counters", ...}}: `producers.json`, or, in a run
    older than that file, the per-producer fields of its last metrics line `last`."""
    current = read_current(run_dir)
    if current or last is None or last.producers is None:
        return current
    counters = last.producer_counters or {}
    return {p: {**v, "counters": counters.get(p, {})} for p, v in last.producers.items()}
