"""Supervised local processes: one consumer and N producers on this machine.

`Supervisor` starts the children through the same CLI a user would type (`python -m launch.cli
consumer …`, `… producer …`), each in its own process group and with a parent-death signal
(Linux), so they never outlive the launcher. Invariants:
- The run is prepared before (RUN_DIR/config.toml written by `launch` or the stress sweep, with
  the run directory claimed and the model directory resolved): the consumer is started with
  `--prepared` and takes that config as it is.
- Processes are tracked by PID/process group, never found or killed by name.
- A producer that fails (non-zero exit) while the consumer still runs is restarted under the same
  producer id (the consumer then expires the leases it lost at once), at most `max_restarts`
  times each, unless it exited with `EXIT_CONFIG` (2: a configuration error, such as a reward
  module that does not import or a model that does not load): no restart can fix that, so it
  is the run's `failure` (its `error:` line) and `run` stops the run with that code. A
  consumer that exits while starting is one too (`StartFailed`), never a traceback.
- Each child may get extra environment variables (`consumer_env`, `producer_env(index)`: the
  stress sweep's GPU placement through `CUDA_VISIBLE_DEVICES`); the rest is inherited.
- `stop()` asks the consumer to finish (SIGINT: final step, final snapshot, ledger), waits, then
  ends the producers (SIGTERM, then SIGKILL after a grace period). After `stop()` no child runs.
  A second Ctrl-C to the launcher is passed on to the consumer (it then stops waiting for
  producers to hear the end).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import EXIT_CONFIG
from common.files import run_files as RF

if TYPE_CHECKING:
    from common.config import Config

log = logging.getLogger("asyncgrpo.launch")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setpgrp()  # own process group: a terminal's Ctrl-C reaches only the launcher
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(frozen=True, slots=True)
class Failure:
    """A child that failed in a way no restart can fix: its name, exit code and the line that
    says why (its last `error:` line, else the last line it wrote)."""

    name: str
    code: int
    line: str

    def __str__(self) -> str:
        return f"{self.name} exited with {self.code}: {self.line}"


class StartFailed(Exception):
    """The consumer exited (or never listened) while the run was starting."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(str(failure))
        self.failure = failure


def last_error(log_path: Path, max_bytes: int = 64 << 10) -> str:
    """The last `error: ...` line a child wrote to its log (the CLI's one-line errors), else
    its last non-empty line ("" when there is none)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    said = [line.strip() for line in lines if line.strip()]
    errors = [line for line in said if line.startswith("error: ")]
    return errors[-1].removeprefix("error: ") if errors else (said[-1] if said else "")


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)  # added to the inherited environment
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    exit_codes: list[int] = field(default_factory=list)
    finished: bool = False  # exited and will not be restarted
    pids: list[int] = field(default_factory=list)

    def start(self) -> None:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
                env={**os.environ, **self.env} if self.env else None,
            )
        self.pids.append(self.proc.pid)

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def wait(self, timeout_s: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None


class Supervisor:
    def __init__(
        self,
        run_dir: Path,
        *,
        config_path: Path,
        num_producers: int,
        producer_args: Callable[[int], list[str]] | None = None,
        consumer_env: dict[str, str] | None = None,
        producer_env: Callable[[int], dict[str, str]] | None = None,
        max_restarts: int = 5,
    ) -> None:
        self.run_dir = run_dir
        self.config_path = config_path
        self.num_producers = num_producers
        self.producer_args = producer_args or (lambda index: [])
        self.consumer_env = consumer_env or {}
        self.producer_env = producer_env or (lambda index: {})
        self.max_restarts = max_restarts
        self.consumer: Child | None = None
        self.producers: list[Child] = []
        self.endpoint = ""
        self.failure: Failure | None = None  # what no restart can fix; the run stops for it

    def _cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "launch.cli", *args]

    def start(self, *, startup_timeout_s: float = 300.0) -> None:
        """Start the consumer and the producers at once (producers wait for the consumer's
        endpoints.json, importing their engine meanwhile), then wait for the endpoints."""
        endpoints = self.run_dir / RF.ENDPOINTS
        endpoints.unlink(missing_ok=True)
        self.consumer = Child(
            "consumer",
            self._cli("consumer", "--config", str(self.config_path), "--prepared"),
            self.run_dir / RF.CONSUMER_STDOUT_LOG,
            env=self.consumer_env,
        )
        self.consumer.start()
        for i in range(self.num_producers):
            name = f"p{i + 1}"
            argv = self._cli(
                "producer",
                "--config",
                str(self.config_path),
                "--connect-file",
                str(endpoints),
                "--id",
                name,
                *self.producer_args(i),
            )
            child = Child(name, argv, self.run_dir / f"producer-{name}.log", self.producer_env(i))
            child.start()
            self.producers.append(child)
        self.record_pids()
        deadline = time.monotonic() + startup_timeout_s
        while not endpoints.exists():
            code = self.consumer.poll()
            if code is not None:
                line = last_error(self.consumer.log_path) or f"see {self.consumer.log_path}"
                self.failure = Failure("consumer", code, line)
                raise StartFailed(self.failure)
            if time.monotonic() > deadline:
                self.failure = Failure(
                    "consumer", 1, f"did not listen within {startup_timeout_s:g} s (still loading?)"
                )
                raise StartFailed(self.failure)
            time.sleep(0.1)
        self.endpoint = RF.read_endpoints(endpoints).control

    def record_pids(self) -> None:
        """`processes.json`: every child started, so nothing outlives the run unnoticed."""
        kids = [self.consumer, *self.producers] if self.consumer else self.producers
        started = {c.name: c.pids for c in kids}
        (self.run_dir / RF.PROCESSES).write_text(json.dumps(started))

    def tick(self) -> int | None:
        """Restart dead producers (not one that exited with a configuration error: that is the
        run's `failure`); the consumer's exit code once it has exited, else None."""
        assert self.consumer is not None
        code = self.consumer.poll()
        if code is not None:
            if code == EXIT_CONFIG and self.failure is None:
                self.failure = Failure("consumer", code, last_error(self.consumer.log_path))
            return code
        for child in self.producers:
            exit_code = child.poll()
            if exit_code is None or child.finished:
                continue
            child.exit_codes.append(exit_code)
            if exit_code == EXIT_CONFIG and self.failure is None:
                child.finished = True
                self.failure = Failure(
                    f"producer {child.name}", exit_code, last_error(child.log_path)
                )
                continue
            if exit_code == 0 or child.restarts >= self.max_restarts:  # 0: the consumer is done
                child.finished = True
                continue
            child.restarts += 1
            log.warning(
                "producer %s exited with %s: restart %d", child.name, exit_code, child.restarts
            )
            child.start()
            self.record_pids()
        return None

    def alive(self) -> list[str]:
        kids = [self.consumer, *self.producers] if self.consumer else self.producers
        return [c.name for c in kids if c.poll() is None]

    def stop(self, *, grace_s: float = 120.0) -> int | None:
        """Finish the consumer cleanly, then end every producer. Returns the consumer's code."""
        code = None
        if self.consumer is not None:
            self.consumer.signal(signal.SIGINT)
            code = self.consumer.wait(grace_s)
            if code is None:
                log.error("consumer did not finish within %.0f s: killing it", grace_s)
                self.consumer.signal(signal.SIGKILL)
                code = self.consumer.wait(10)
        for child in self.producers:
            child.signal(signal.SIGTERM)
        for child in self.producers:
            if child.wait(10) is None:
                child.signal(signal.SIGKILL)
                child.wait(10)
        return code


def local_config(cfg: Config, given: AbstractSet[str]) -> Config:
    """A `launch` run's snapshot settings: every producer reads the learner's files on this
    host and none fetches over the network, so the sparse deltas network fetchers would take
    are not made (`snapshot.anchor_every = 0`: ~4 ms of the writer thread's CPU per version on
    the demo) unless the user set the key."""
    from common import config as C

    if "snapshot.anchor_every" in given:
        return cfg
    return C.override(cfg, {"snapshot.anchor_every": 0})


def _watch(
    sup: Supervisor,
    stop: threading.Event,
    tail: Any,
    on_tick: Callable[[Supervisor], None] | None,
    line: Callable[[], None] | None,
    clock: Any,
) -> int | None:
    """Tick the supervisor every 0.25 s until `stop` is set or the run ends (its exit code);
    `line`, if given, prints a progress line when `clock` (common.progress.Ticker) says."""
    while not stop.is_set():
        code = sup.tick()
        tail.poll()
        if on_tick is not None:
            on_tick(sup)
        step = tail.records[-1].step if tail.records else 0
        if line is not None and clock.due(step, time.monotonic()):
            line()
        if code is not None:
            return code
        if sup.failure is not None:  # a producer that no restart can fix: the run cannot go on
            return sup.failure.code
        time.sleep(0.25)
    return None


def _catch_stop(sup: Supervisor, stop: threading.Event, hurry: threading.Event) -> dict[int, Any]:
    """SIGINT/SIGTERM set `stop`; a second one sets `hurry` and passes SIGINT on to the consumer
    (it stops waiting for producers to hear the end). Returns the handlers it replaced."""

    def ask_stop(signum: int, _frame: object) -> None:
        if stop.is_set():
            hurry.set()
            if sup.consumer is not None:
                sup.consumer.signal(signal.SIGINT)
        stop.set()

    return {s: signal.signal(s, ask_stop) for s in (signal.SIGINT, signal.SIGTERM)}


@dataclass(frozen=True, slots=True)
class Wording:
    """What the plain progress lines say besides the run's own figures: `label` starts every
    line (a sweep's setting), `beyond` says why a run goes on past its steps
    (`launch.dashboard.step_text`), `again` what a second Ctrl-C skips besides waiting for the
    producers (the stopping line)."""

    label: str = ""
    beyond: str = ""
    again: str = ""


def run(
    sup: Supervisor,
    *,
    steps: int,
    live: bool,
    wording: Wording = Wording(),
    on_tick: Callable[[Supervisor], None] | None = None,
    stop_event: threading.Event | None = None,
    hurry_event: threading.Event | None = None,
) -> int:
    """Start what `sup` supervises, watch it (restarting producers), stop cleanly; the
    consumer's code.

    Ctrl-C (SIGINT) or SIGTERM to the launcher ends the run early, the same clean way, and so
    does setting `stop_event` (which a signal sets too, so the caller can tell afterwards); a
    second one sets `hurry_event` and is passed on to the consumer. A child that fails in a way
    no restart can fix (`sup.failure`: a configuration error, or a consumer that exited while
    starting) ends the run with its code, said in one `error:` line. Without `live`, a plain
    progress line (`wording`) every 10 s, at the first step and at each tenth of the steps
    (`common.progress.Ticker`), never wrapped (one line per record in a log file).
    """
    from rich.console import Console
    from rich.live import Live

    from common.progress import Ticker
    from launch.dashboard import MetricsTail, render, run_line

    run_dir, label = sup.run_dir, wording.label
    stop = stop_event if stop_event is not None else threading.Event()
    hurry = hurry_event if hurry_event is not None else threading.Event()
    previous = _catch_stop(sup, stop, hurry)
    tail = MetricsTail(run_dir / RF.METRICS)
    console = Console(stderr=True)
    t0 = time.monotonic()

    def view() -> Any:
        restarts = {c.name: c.restarts for c in sup.producers}
        return render(tail, steps=steps, elapsed_s=time.monotonic() - t0, restarts=restarts)

    def say(text: str) -> None:  # a plain line, never wrapped at the console's width
        console.print(
            f"{label} {text}" if label else text, highlight=False, markup=False, soft_wrap=True
        )

    said: list[int] = []  # the newest step a plain line showed

    def line() -> None:
        said[:] = [tail.records[-1].step if tail.records else 0]
        say(run_line(run_dir, tail, steps, time.monotonic() - t0, beyond=wording.beyond))

    code: int | None = None
    try:
        try:
            sup.start()
        except StartFailed as exc:
            code = exc.failure.code
            return code
        display = (
            Live(get_renderable=view, console=console, refresh_per_second=2)
            if live
            else nullcontext()
        )
        with display:
            clock = Ticker(steps, t0)
            code = _watch(sup, stop, tail, on_tick, None if live else line, clock)
    finally:
        if stop.is_set():
            again = f"; {wording.again}" if wording.again else ""
            say(
                "stopping: the consumer finishes its step and writes a final snapshot… (Ctrl-C "
                f"again: stop without waiting for the producers to hear the end{again})"
            )
        stopped = sup.stop()
        code = code if code is not None else stopped
        for s, handler in previous.items():
            signal.signal(s, handler)
        tail.poll()
        if sup.failure is not None:
            console.print(
                f"error: {sup.failure}", style="red", highlight=False, markup=False, soft_wrap=True
            )
    if tail.records and sup.failure is None and (live or said != [tail.records[-1].step]):
        line()  # the run's last figures, unless the last plain line already showed them
    return int(code) if code is not None else 1
