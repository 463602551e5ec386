"""A tracker in a process of its own, at the lowest CPU priority (each: TensorBoard's and W&B's).

W&B's `run.log` is Python that holds the GIL, and its service process (which it starts) takes a
core: in the learner's process, on a machine whose cores the learner and the producers already
use, both are taken from training (the learner's step took 1.2-1.7x as long on two cores).
`ChildSink` runs the tracker in a spawned child instead. The child builds the tracker at the
priority it started with (the learner's): its start-up (`import wandb` and `wandb.init`, about a
second of CPU) overlaps the model's load, as a tracker's start does in a trainer that calls
`wandb.init` before its first step, but never holds training back. Niced from birth, the same
start-up was pushed into the first steps on two busy cores: the demo with both trackers ran
1.03x the s/step without them (1.00x built first; the whole command 1.06x and 1.04x).
Once the tracker is built, the child lowers every thread of its own and of the processes the
tracker started (W&B's service, `lower_tree`) to the lowest priority a process can give itself:
niceness 19 (a weight of 15 against training's 1,024 on a contended core) under Linux's
`SCHED_BATCH` policy (its wake-ups never preempt a running training thread); threads started
later inherit both. At niceness +10 alone the child and its service took 3-12% of the
learner's pace on two busy cores (bench/observability.py). Not `SCHED_IDLE`: on cores that
training keeps busy an idle-class tracker gets no time at all, and a run's last calls could not
be written within `CLOSE_S`. TensorBoard's `add_scalar` is Python under the GIL too: written
from the learner's process, it made the optimizer step 1.17x as long on the demo (1.00x in a
child).

The logger thread calls a `ChildSink` as it would the tracker (`config`, `metrics`,
`completions`, `close`): each call is one message on a pipe (`multiprocessing` queue), so it
never waits for the tracker. A tracker that raises in the child, or a child that dies, makes
the next call (or `close`) raise a `TrackerFailed` with the child's one-line reason, which the
logger thread reports once and drops, as for a tracker in its own process.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import queue
from typing import Any

NICE = 19  # the child's niceness: the lowest (Linux: 19, a CPU weight of 15 against 1,024)
CLOSE_S = 60.0


class TrackerFailed(RuntimeError):
    """The tracker in the child raised, or the child exited: the message says which."""


class ChildSink:
    """`factory` ("module:Class") built in the child with `kwargs`; `name` as the tracker's."""

    def __init__(self, name: str, factory: str, kwargs: dict[str, Any]) -> None:
        import multiprocessing

        self.name = name
        ctx = multiprocessing.get_context("spawn")
        self._calls: Any = ctx.Queue()
        self._errors: Any = ctx.Queue()
        self.niceness = max(os.getpriority(os.PRIO_PROCESS, 0), NICE)
        self._proc = ctx.Process(
            target=serve,
            args=(factory, kwargs, self._calls, self._errors, self.niceness),
            name=f"asyncgrpo-{name}",
            daemon=True,
        )
        self._proc.start()

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._proc.pid

    def config(self, toml_text: str) -> None:
        self._send("config", toml_text)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self._send("metrics", step, values)

    def completions(self, step: int, rows: list[Any]) -> None:
        self._send("completions", step, rows)

    def flush(self) -> None:
        self._send("flush")

    def close(self) -> None:
        """Let the child finish what it was sent and close the tracker; at most `CLOSE_S`."""
        if self._proc.is_alive():
            self._calls.put(None)
            self._proc.join(CLOSE_S)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
            raise TrackerFailed(f"did not close within {CLOSE_S:.0f} s; stopped")
        self._check()

    def _send(self, method: str, *args: Any) -> None:
        self._check()
        self._calls.put((method, args))

    def _check(self) -> None:
        try:
            reason = self._errors.get_nowait()
        except queue.Empty:
            reason = None
        if reason is None and not self._proc.is_alive() and self._proc.exitcode not in (0, None):
            reason = f"its process exited with code {self._proc.exitcode}"
        if reason is not None:
            raise TrackerFailed(reason)


def lower(tid: int, niceness: int) -> None:
    """Put thread `tid` (0: the calling one) under `SCHED_BATCH` where Linux has it, at
    `niceness` (Linux keeps both per thread; a thread or process started later inherits them)."""
    if hasattr(os, "SCHED_BATCH"):
        os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
    os.setpriority(os.PRIO_PROCESS, tid, niceness)


def lower_tree(pid: int, niceness: int) -> None:
    """`lower` every thread of process `pid` and of every process descended from it (read from
    /proc: Linux only; elsewhere the calling thread alone); one that ended meanwhile is
    skipped."""
    if not os.path.isdir("/proc/self/task"):
        lower(0, niceness)
        return
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:  # "pid (comm) state ppid ...": comm may hold ")"
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    todo = [pid]
    while todo:
        proc = todo.pop()
        todo.extend(children.get(proc, ()))
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{proc}/task")]
        except OSError:
            continue
        for tid in tids:  # one that ended meanwhile (ProcessLookupError) or is not ours: skipped
            with contextlib.suppress(OSError):
                lower(tid, niceness)


def serve(factory: str, kwargs: dict[str, Any], calls: Any, errors: Any, niceness: int) -> None:
    """The child: build the tracker (at the priority it was started with), then lower itself,
    its threads and the processes it started (W&B's service) to `niceness`, and apply each call
    until None (then close it)."""
    try:
        module, cls = factory.split(":")
        sink = getattr(importlib.import_module(module), cls)(**kwargs)
        lower_tree(os.getpid(), niceness)
        while (call := calls.get()) is not None:
            method, args = call
            getattr(sink, method)(*args)
        sink.close()
    except Exception as exc:  # handed to the logger thread, which reports it once
        errors.put(f"{type(exc).__name__}: {exc}")
