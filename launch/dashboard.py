"""Live progress of a run, read from its files (the processes are never asked).

`MetricsTail` follows `metrics.jsonl` by file offset (a torn last line is read again next time)
and keeps its lines as `common.files.metrics.StepRecord`s.
`render(...)` builds one rich renderable: a progress bar of steps, the newest learner metrics,
the ledger, reward failures, and one row per producer (weight version, state, restarts). On a
terminal the launcher shows it with `rich.live.Live`; otherwise it prints one plain line every
few seconds (`summary_line`), and so does a consumer started by hand (`Progress`, a thread).
`status(run_dir)` is the text of `asyncgrpo status RUN_DIR`: where a run stands, from any shell.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
from rich.console import Group
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table

from common.files import run_files as RF
from common.files import run_state as RS
from common.files.metrics import StepRecord
from common.progress import Ticker
from consumer.evaluation.report import eval_text
from launch.headline import fn_means_text, no_signal, reward_text, signal_text


class MetricsTail:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self.records: list[StepRecord] = []

    def poll(self) -> list[StepRecord]:
        """New complete records since the last call."""
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self._offset)
            chunk = f.read()
        lines = chunk.split("\n")
        new = []
        for line in lines[:-1]:  # the last element is "" or a line still being written
            self._offset += len(line.encode()) + 1
            if line.strip():
                new.append(StepRecord.from_json(json.loads(line)))
        self.records.extend(new)
        return new


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def reward_failures(views: Mapping[str, RF.ProducerStatus]) -> tuple[int, int]:
    """(reward calls that failed, that timed out) so far, over every producer's heartbeat
    counters in `views` (common/files/run_files.py `latest_producers`; a restarted producer counts
    from 0 again)."""
    errors = sum(v.reward_errors for v in views.values())
    timeouts = sum(v.reward_timeouts for v in views.values())
    return errors, timeouts


def step_text(step: int, steps: int, beyond: str = "") -> str:
    """`step 3/50`; without a step limit (`steps` 0) `step 3`; past the limit (a sweep's
    asynchronous setting runs on to the synchronous one's wall-clock) `step 59 (30 done,
    BEYOND)`, never `step 59/30`."""
    if steps <= 0:
        return f"step {step}"
    if step > steps:
        return f"step {step} ({steps} done" + (f", {beyond})" if beyond else ")")
    return f"step {step}/{steps}"


def summary_line(
    rec: StepRecord | None,
    steps: int,
    elapsed_s: float,
    ledger: RF.Balance | None = None,
    views: Mapping[str, RF.ProducerStatus] | None = None,
    *,
    signal: RS.Signal | None = None,
    beyond: str = "",
    evaluated: str = "",
) -> str:
    """One plain progress line; before the first step, the ledger's counts (`ledger.json`'s
    balance) and the signal watch (`signal.json`: groups arrived, with a signal, and why none
    carries one) say whether groups arrive and why none was trained, and the producers' states
    (`views`, common/files/run_files.py) whether they are still starting; `views` add reward
    failures; `beyond` says why a run goes on past `steps` (`step_text`); `evaluated`, the
    newest evaluation (consumer/evaluation/report.py)."""
    watched = signal_text(signal, stepped=rec is not None)
    warning = None if watched and rec is None else no_signal(rec, ledger)
    tail = "".join(f" — {text}" for text in (watched, warning) if text)
    if rec is None:
        counts = ledger.to_json() if ledger is not None else {}
        seen = {k: v for k, v in counts.items() if k not in ("ok", "open") and v}
        arrived = signal is not None or any(k in seen for k in RF.FINAL_STATES)
        waiting = "" if arrived else _producers_text(views or {})
        return (
            f"[{elapsed_s:6.0f}s] waiting for the first step…"
            + (" ledger " + " ".join(f"{k} {v}" for k, v in sorted(seen.items())) if seen else "")
            + (f" {waiting}" if waiting else "")
            + tail
        )
    acc = rec.heldout_accuracy
    errors, timeouts = reward_failures(views or {})
    return (
        f"[{elapsed_s:6.0f}s] {step_text(rec.step, steps, beyond)} {reward_text(rec)}"
        + (f" heldout {acc:.3f}" if acc is not None else "")
        + (f" {evaluated}" if evaluated else "")
        + f" staleness {rec.staleness_mean:.2f}/{rec.staleness_max}"
        + f" tok/s {rec.tokens_per_s:.0f} idle {rec.learner_idle_frac:.2f}"
        + (f" reward errors {errors} timeouts {timeouts}" if errors or timeouts else "")
        + tail
    )


def _producers_text(views: Mapping[str, RF.ProducerStatus]) -> str:
    """`no group yet; producers: p1 loading, p2 generating` (before any group arrived)."""
    states = ", ".join(f"{name} {view.state}" for name, view in sorted(views.items()))
    return "no group yet; " + (f"producers: {states}" if states else "no producer registered yet")


def run_line(
    run_dir: Path,
    tail: MetricsTail,
    steps: int,
    elapsed_s: float,
    *,
    beyond: str = "",
) -> str:
    """`summary_line` of a run from its files (metrics as `tail` has read them, the ledger, the
    producers, the signal watch): the launcher's plain lines, a consumer's own and `status`."""
    rec = tail.records[-1] if tail.records else None
    ledger = RF.latest_ledger(run_dir)
    return summary_line(
        rec,
        steps,
        elapsed_s,
        ledger.balance if ledger is not None else None,
        RF.latest_producers(run_dir, rec),
        signal=RS.read_signal(run_dir),
        beyond=beyond,
        evaluated=eval_text(tail.records),
    )


class Progress:
    """A daemon thread logging `summary_line` for a consumer run by hand (and a replay) when
    `common.progress.Ticker` says: every 10 s, at the first step and at each tenth of the
    steps (the launcher has its own display). Reads only the run's files."""

    def __init__(self, run_dir: Path, steps: int, every_s: float = 10.0) -> None:
        self.run_dir, self.steps, self.every_s = run_dir, steps, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        log = logging.getLogger("asyncgrpo.progress")
        tail, t0 = MetricsTail(self.run_dir / RF.METRICS), time.monotonic()
        clock = Ticker(self.steps, t0, self.every_s)
        while not self._stop.wait(min(self.every_s, 0.5)):
            tail.poll()
            step = tail.records[-1].step if tail.records else 0
            if clock.due(step, time.monotonic()):
                log.info("%s", run_line(self.run_dir, tail, self.steps, time.monotonic() - t0))


def run_state(run_dir: Path) -> str:
    """Finished (its steps done or its prompts used up), stopped (by a signal, or for want of a
    learning signal: final.json says how it ended), running (its consumer's process is alive:
    consumer.json), or stopped without finishing (crashed or killed), with what to do about it."""
    final = RS.read_final(run_dir)
    if final is not None:
        return _ended(run_dir, final)
    proc = RS.read_consumer(run_dir)
    if proc is not None and proc.host != socket.gethostname():
        return f"not finished; its consumer runs (or ran) on {proc.host}, pid {proc.pid}"
    if proc is not None and _alive(proc.pid, proc.started):
        return f"running (consumer pid {proc.pid})"
    if proc is None:
        return "not finished, and no consumer has listened for it yet (starting, or stopped first)"
    return (
        f"stopped without finishing (its consumer, pid {proc.pid}, is gone: crashed or "
        f"interrupted); `asyncgrpo launch --run-dir {run_dir} --resume` continues it"
    )


def _ended(run_dir: Path, final: RS.Final) -> str:
    """How a run that wrote final.json ended, in `status`'s words."""
    if final.ended == "data":
        return f"finished at step {final.version}: its prompts ran out (task.epochs)"
    if final.finished:
        return "finished"
    resume = f"`asyncgrpo launch --run-dir {run_dir} --resume` continues it"
    at = f"at step {final.version}" if final.version else "before its first step"
    if final.ended == "no_signal":
        return f"stopped {at}: {final.reason}"
    return f"stopped {at} by Ctrl-C or SIGTERM; {resume}"


def ledger_text(balance: RF.Balance) -> str:
    """`issued 8 trained 0 ... open 0 (balanced)`: the counts, and whether they balance."""
    counts = {k: v for k, v in balance.to_json().items() if k != "ok"}
    shown = " ".join(f"{k} {v}" for k, v in counts.items())
    if balance.ok is None:
        return shown
    return shown + (" (balanced)" if balance.ok else " (DOES NOT BALANCE: a bug; please report)")


def _alive(pid: int, started: float) -> bool:
    """Process `pid` exists, is no zombie, and began by `started` (not a reused pid)."""
    try:
        p = psutil.Process(pid)
        return bool(p.status() != psutil.STATUS_ZOMBIE and p.create_time() <= started + 1)
    except psutil.Error:
        return False


def status(run_dir: Path) -> str:
    """Where a run stands, from its files: progress, ledger, producers, reward failures."""
    tail = MetricsTail(run_dir / RF.METRICS)
    tail.poll()
    rec = tail.records[-1] if tail.records else None
    ledger = RF.latest_ledger(run_dir)
    steps = _configured_steps(run_dir)
    lines = [f"run {run_dir}: {run_state(run_dir)}"]
    lines.append(run_line(run_dir, tail, steps, run_clock(run_dir, rec)))
    if ledger is not None:
        lines.append(f"ledger: {ledger_text(ledger.balance)}")
        rejected = ledger.refused()
        if rejected:
            lines.append("refused messages: " + " ".join(f"{k} {v}" for k, v in rejected.items()))
    for name, view in sorted(RF.latest_producers(run_dir, rec).items()):
        lines.append(
            f"producer {name}: weights v{view.version} {view.state}, groups sent "
            f"{view.groups_sent}, reward errors {view.reward_errors} timeouts "
            f"{view.reward_timeouts}"
        )
    lines.append(f"plots and summary: asyncgrpo report {run_dir}")
    return "\n".join(lines)


def run_clock(run_dir: Path, rec: StepRecord | None) -> float:
    """Seconds from the consumer's start (consumer.json `began`, the clock the console's
    elapsed counts on) to `rec`'s step; the learner's own clock (`time_s`, from its first
    group) in runs older than `began`; 0 without a step."""
    if rec is None:
        return 0.0
    proc = RS.read_consumer(run_dir)
    if proc is None or proc.began is None:
        return rec.time_s
    return rec.unix_time - proc.began


def _configured_steps(run_dir: Path) -> int:
    import tomllib

    try:
        with open(run_dir / RF.CONFIG, "rb") as f:
            return int(tomllib.load(f).get("run", {}).get("steps", 0))
    except (OSError, ValueError):
        return 0


def render(tail: MetricsTail, *, steps: int, elapsed_s: float, restarts: dict[str, int]) -> Group:
    rec = tail.records[-1] if tail.records else None
    views = RF.latest_producers(tail.path.parent, rec)
    done = rec.step if rec else 0
    acc = next(
        (r.heldout_accuracy for r in reversed(tail.records) if r.heldout_accuracy is not None),
        None,
    )
    window = tail.records[-10:]
    span = window[-1].time_s - window[0].time_s if len(window) > 1 else 0.0
    groups_per_s = (
        (window[-1].groups_trained - window[0].groups_trained) / span if span > 0 else None
    )
    top = Table.grid(padding=(0, 2))
    top.add_row(
        "step", step_text(done, steps).removeprefix("step "), "elapsed", f"{elapsed_s:.0f} s"
    )
    if rec is not None:
        top.add_row(
            "reward", reward_text(rec).removeprefix("reward "), "held-out accuracy", _fmt(acc)
        )
        if rec.reward_fn_means:
            top.add_row("per function", fn_means_text(rec), "", "")
        evaluated = eval_text(tail.records)
        if evaluated:
            top.add_row("evaluation", evaluated, "", "")
        top.add_row(
            "staleness mean/max",
            f"{rec.staleness_mean:.2f} / {rec.staleness_max}",
            "learner idle",
            _fmt(rec.learner_idle_frac, ".2f"),
        )
        top.add_row(
            "groups/s", _fmt(groups_per_s, ".2f"), "tokens/s", _fmt(rec.tokens_per_s, ".0f")
        )
        top.add_row(
            "TIS weight mean",
            _fmt(rec.tis_weight_mean),
            "clip fraction",
            _fmt(rec.clip_frac_high),
        )
        top.add_row(
            "ledger",
            f"trained {rec.groups_trained} · "
            f"stale {rec.groups_dropped_stale} · "
            f"zero-var {rec.groups_dropped_zero_variance} · "
            f"expired {rec.groups_expired}",
            "",
            "",
        )
        warning = no_signal(rec)
        if warning:
            top.add_row("no signal", warning.removeprefix("no signal: "), "", "", style="yellow")
        errors, timeouts = reward_failures(views)
        if errors or timeouts:
            top.add_row(
                "reward failures", f"errors {errors} · timeouts {timeouts}", "", "", style="yellow"
            )
    watched = signal_text(RS.read_signal(tail.path.parent), stepped=rec is not None)
    if watched:
        top.add_row("groups" if rec is None else "signal", watched, "", "", style="yellow")
    prods = Table("producer", "weights", "state", "restarts", box=None, pad_edge=False)
    for name, view in sorted(views.items()):
        prods.add_row(name, f"v{view.version}", view.state, str(restarts.get(name, 0)))
    bar = ProgressBar(total=max(steps, 1), completed=done, width=60)
    return Group(Panel(Group(bar, top), title="asyncgrpo"), prods)
