"""How a run stands: the consumer serving it (`consumer.json`), whether its groups carry a
learning signal (`signal.json`) and how it ended (`final.json`), one typed record each (the
names are in common/files/run_files.py).

- `consumer.json` (`CONSUMER`): `ConsumerProcess`, the consumer serving the run (host, pid,
  start), written when it listens: with no `final.json`, a live process there is a running run
  and a dead one a run that crashed or was killed (launch/dashboard.py `run_state`).
- `final.json` (`FINAL`): `Final`, the snapshot version the run ended with and how it ended
  (`ENDINGS`: its steps done, its prompts used up, stopped by a signal, or stopped for want of
  a learning signal, with the reason), written durably by common/weights/snapshot.py
  `write_final`; `status` and summary.md say "finished" only for the first two.
- `signal.json` (`SIGNAL`): `Signal`, whether the groups arriving for training carry a learning
  signal and, when they do not, why (consumer/no_signal.py); replaced by the learner every few
  seconds while groups arrive, so the console, the dashboard and `status` say it before the
  first step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from common.files.run_files import CONSUMER, FINAL, SIGNAL, _Record, _replace_atomically


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerProcess(_Record):
    """The consumer process serving a run: its host's name, pid, when it listened (`started`)
    and when the process began (`began`, before it loaded the model: the run's clock for the
    console and summary.md; None in older runs), Unix times in seconds."""

    host: str
    pid: int
    started: float
    began: float | None = None


def write_consumer(run_dir: Path, process: ConsumerProcess) -> None:
    _replace_atomically(run_dir / CONSUMER, json.dumps(process.to_json()))


def read_consumer(run_dir: Path) -> ConsumerProcess | None:
    """The run's `consumer.json`; None when it is absent or unreadable (an older run)."""
    return _read(run_dir / CONSUMER, ConsumerProcess)


R = TypeVar("R", bound=_Record)


def _read(path: Path, record: type[R]) -> R | None:
    """The record in `path`; None when it is absent or unreadable."""
    try:
        return record.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


# How a run ended: its run.steps done; its prompts used up (task.epochs); stopped by a signal
# (Ctrl-C, SIGTERM); stopped because no arriving group carried a learning signal for the budget.
ENDINGS = ("steps", "data", "stopped", "no_signal")


@dataclass(frozen=True, slots=True, kw_only=True)
class Final(_Record):
    """`final.json`: the snapshot a run ended with (`snapshot`, relative to the run directory)
    and how it ended (one of `ENDINGS`; "" in runs older than the field, which only ever wrote
    it at the end), with the reason when it stopped early."""

    version: int
    snapshot: str = ""
    ended: str = ""
    reason: str = ""

    @property
    def finished(self) -> bool:
        """Its work done (steps or prompts), not stopped early."""
        return self.ended in ("", "steps", "data")


def read_final(run_dir: Path) -> Final | None:
    """The run's `final.json`; None when it has not ended (or the file is unreadable)."""
    return _read(run_dir / FINAL, Final)


@dataclass(frozen=True, slots=True, kw_only=True)
class Signal(_Record):
    """Whether the groups arriving for training carry a learning signal (unequal rewards):
    totals since the start, the streak of groups in a row without one (its length and seconds)
    and why (consumer/no_signal.py), whether the run stopped for it, and the budget."""

    groups: int
    with_signal: int
    streak: int
    streak_s: float
    why: str
    stopped: bool = False
    max_groups: int = 0
    max_s: float = 0.0
    first_error: str = ""  # the run's first failed reward call, in one line ("" when none)


def write_signal(run_dir: Path, signal: Signal) -> None:
    _replace_atomically(run_dir / SIGNAL, json.dumps(signal.to_json()))


def read_signal(run_dir: Path) -> Signal | None:
    """The run's `signal.json`; None before the first group arrived (or in an older run)."""
    return _read(run_dir / SIGNAL, Signal)
