"""The cores of one host shared by the processes of one run: who has work now, and each one's
torch threads (`torch.set_num_threads`), decided again before every unit of work.

Why: a learner and the producers on one host take turns more than they run together. On the
2-core machine, SmolLM2-135M's learner step and its producer's generation each fill one core
for seconds, then wait for the other (the learner for groups, the producer for a newer
version); with one thread each, a core idles whenever one of them waits. With the board a
process that has work takes the cores the idle ones leave, and gives them back as soon as they
have work again, never running more threads in total than the host has cores when it can help
it (more busy processes than cores: one thread each, the least that runs at all).

How: every member keeps one small file in the board's directory (`directory_for(run_id)`:
/dev/shm, so only processes on this host see it; another host's producers have a board of their
own, their host's cores to themselves). A member's record (`Member`): its pid (a dead one is
left out), whether it is busy, its weight (work per learner step: CPU-seconds measured over
the run, or the cost model's estimate until then), the threads the user fixed (0 = it shares)
and the most threads that still help it. `shares(cores, members)` (pure) gives each busy sharer
at least one thread and splits the rest in proportion to the weights, within each one's most;
every member computes the same split from the same records. A member asks `threads()` right
before a unit of work (the learner: a forward/backward pass; an hf producer: a token step), as
busy; it writes its record only when its busy state changes (a few times per step) and re-reads
the others' at most every `refresh_s`.

Explicit settings win: a member with `fixed` threads keeps them, and the others share what is
left. Nothing here is needed for correctness: without a board (another engine, a replay) a
process runs with its configured threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger("asyncgrpo.cores")
SHM = Path("/dev/shm")


@dataclass(frozen=True, slots=True)
class Member:
    name: str  # "learner" or the producer's id
    pid: int
    busy: bool
    weight: float  # work per learner step (any unit, the same for every member), > 0
    fixed: int = 0  # threads the user set (kept whatever the others do); 0 = shares
    max_threads: int = 1 << 10  # threads beyond which this process gets no faster


SMALL_MODEL = 10_000_000  # parameters: below, a second thread makes a process slower


def useful_threads(num_params: int) -> int:
    """The most threads that still speed up a process computing with a model this large: one
    below `SMALL_MODEL` parameters (the demo's 0.1M-parameter learner step took 36 ms on one
    thread and 67 ms on two: its products are too small to split), no limit above
    (SmolLM2-135M's step took 1.7x less time on two)."""
    return 1 if num_params < SMALL_MODEL else 1 << 10


def small_note(num_params: int) -> str:
    """What a start-up line adds when `useful_threads` caps a process at one thread."""
    if num_params >= SMALL_MODEL:
        return ""
    return f"; one at most: a model of {num_params / 1e6:.1f}M parameters gets no faster on more"


def usable_cores() -> int:
    """CPUs this process may run on (a container's or `taskset`'s limit)."""
    return len(os.sched_getaffinity(0))


def directory_for(run_id: str) -> Path:
    """The board of run `run_id` on this host (shared memory where there is some)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in run_id)
    base = SHM if SHM.is_dir() else Path(tempfile.gettempdir())
    return base / f"asyncgrpo-cores-{safe}"


def shares(cores: int, members: list[Member]) -> dict[str, int]:
    """Threads of every busy member (pure): fixed ones keep theirs; the sharers split what is
    left, at least one each, then one thread at a time to the sharer with the largest
    weight / (threads + 1) (D'Hondt: shares in proportion to the weights; ties to the first
    name), none beyond its `max_threads` (what one cannot use goes to the others)."""
    busy = sorted((m for m in members if m.busy), key=lambda m: m.name)
    out = {m.name: m.fixed for m in busy if m.fixed}
    sharers = [m for m in busy if not m.fixed]
    left = max(cores - sum(out.values()), 0) - len(sharers)
    got = {m.name: 1 for m in sharers}
    while left > 0:
        open_ = [m for m in sharers if got[m.name] < m.max_threads]
        if not open_:
            break
        pick = max(open_, key=lambda m: m.weight / (got[m.name] + 1))  # first of equals
        got[pick.name] += 1
        left -= 1
    return out | got


class CoreBoard:
    """This process's seat on the board of its run (see the module docstring)."""

    def __init__(
        self,
        directory: Path,
        name: str,
        *,
        weight: float,
        fixed: int = 0,
        max_threads: int = 1 << 10,
        cores: int | None = None,
        refresh_s: float = 0.02,
    ) -> None:
        assert weight > 0, weight
        self.directory = directory
        self.cores = cores or usable_cores()
        self.refresh_s = refresh_s
        self._me = Member(name, os.getpid(), False, weight, fixed, max(1, max_threads))
        self._others: list[Member] = []
        self._read_at = -1.0
        directory.mkdir(parents=True, exist_ok=True)
        self._write()

    @property
    def me(self) -> Member:
        return self._me

    def update(self, *, busy: bool | None = None, weight: float | None = None) -> None:
        """Change this member's busy state or weight (written only if the busy state changes
        or the weight moves by more than 10%)."""
        me = self._me
        new = dataclasses.replace(
            me,
            busy=me.busy if busy is None else busy,
            weight=me.weight if weight is None or weight <= 0 else weight,
        )
        self._me = new
        if new.busy != me.busy or abs(new.weight - me.weight) > 0.1 * me.weight:
            self._write()

    def members(self) -> list[Member]:
        """Every live member (this one included), the others as last read."""
        now = time.monotonic()
        if now - self._read_at >= self.refresh_s:
            self._others = [m for m in _read(self.directory) if m.name != self._me.name]
            self._read_at = now
        return [self._me, *self._others]

    def threads(self) -> int:
        """This member's threads for the work it is about to do (it counts as busy)."""
        if not self._me.busy:
            self.update(busy=True)
        return shares(self.cores, self.members())[self._me.name]

    def describe(self) -> str:
        """Who is busy and with how many threads, as this member sees it now."""
        members = self.members()
        got = shares(self.cores, members)
        parts = [f"{m.name} {got[m.name]}" if m.busy else f"{m.name} idle" for m in members]
        return f"{self.cores} cores: " + ", ".join(parts)

    def close(self) -> None:
        """Leave the board (the last one out removes its directory)."""
        (self.directory / self._me.name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # others are still on it
            self.directory.rmdir()

    def _write(self) -> None:
        path = self.directory / self._me.name
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self._me)))
        os.replace(tmp, path)


class Share(Protocol):
    """What a trainer asks of its threads' source: before each unit of work, how many torch
    threads to run it with; at a step's start, how the cores stand; at its end, that it is
    done (idle until the next)."""

    per_layer: bool  # a CPU trainer takes threads before each decoder layer too (not only a pass)

    def work(self) -> int: ...

    def describe(self) -> str: ...

    def finished_step(self) -> None: ...


class Recorded:
    """The threads a recorded run used, unit after unit (a replay: thread counts change a CPU
    step's float rounding, so a replay reproduces them to reproduce its hashes); past the end,
    the last one. `per_layer`: the recording has the decoder layers' units too (else one entry
    per pass, as recorded before the layers took threads: the replay's layers take none)."""

    def __init__(self, threads: tuple[int, ...], *, per_layer: bool = True) -> None:
        assert threads, "a recording with no passes"
        assert min(threads) >= 1, threads
        self._threads, self._next = threads, 0
        self.per_layer = per_layer

    def work(self) -> int:
        n = self._threads[min(self._next, len(self._threads) - 1)]
        self._next += 1
        return n

    def describe(self) -> str:
        return f"as recorded: {', '.join(map(str, self._threads))} threads"

    def finished_step(self) -> None:
        """Nothing to give back: a replay runs alone."""


class Seat:
    """One member's use of its board: busy from `work()` to `rest()`, and its weight the busy
    CPU-seconds of this process per unit of progress (`progress(n)`: a learner step, or
    policy versions a producer moved on by), smoothed; equal weights until the first."""

    SMOOTHING = 0.3  # weight of the newest measurement

    def __init__(self, board: CoreBoard) -> None:
        self.board = board
        # threads follow the work within a pass too, unless one is all this member can use
        self.per_layer = board.me.max_threads > 1
        self._busy_since: float | None = None  # process CPU time when work began
        self._busy_cpu = 0.0  # since the last progress
        self._measured = False

    def work(self) -> int:
        """Threads for the work about to start (this member is busy from now)."""
        if self._busy_since is None:
            self._busy_since = time.process_time()
        return self.board.threads()

    def rest(self) -> None:
        """The work is done: idle (the others may take the cores)."""
        if self._busy_since is not None:
            self._busy_cpu += time.process_time() - self._busy_since
            self._busy_since = None
            self.board.update(busy=False)

    def progress(self, units: float) -> None:
        """`units` of progress since the last call: the busy CPU-seconds per unit become the
        weight (the first measurement as is, then smoothed)."""
        if units <= 0 or self._busy_cpu <= 0:
            return
        per_unit = self._busy_cpu / units
        old = self.board.me.weight
        new = (1 - self.SMOOTHING) * old + self.SMOOTHING * per_unit if self._measured else per_unit
        self._measured = True
        self._busy_cpu = 0.0
        self.board.update(weight=max(new, 1e-3))

    def describe(self) -> str:
        return self.board.describe()

    def finished_step(self) -> None:
        """A learner's step is done: idle, and one step of progress."""
        self.rest()
        self.progress(1)

    def close(self) -> None:
        self.board.close()


def _read(directory: Path) -> list[Member]:
    """The live members' records (a dead process's or an unreadable record is left out)."""
    out: list[Member] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return out
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            member = Member(**json.loads(Path(entry.path).read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if _alive(member.pid):
            out.append(member)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
