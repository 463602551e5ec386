"""One group's reward calls, as a reward worker process runs them (spawned by the runner in
producer/rewards/runner.py; the bounded built-ins run here in the producer itself, with no timer).

`score_group(specs, completions, row, timeout_s)` calls every reward on the group the way its
signature asks (producer/rewards/calls.py: per completion or per group, positionally or by name,
awaited if async) and returns the table of values with what failed. Invariants:
- A call that raises, returns a non-number (bool counts as 0/1) or a non-finite value scores 0
  for that completion and counts as an error; a per-group call that returns anything but G
  numbers scores 0 for all G and counts G errors; a non-finite one of its G numbers scores 0
  for that completion, one error. Counts are per (reward, completion), whatever the plan.
- A call that runs longer than its timer (`timeout_s`; a per-group call `timeout_s * G`) is
  interrupted by an ITIMER_REAL alarm raising a BaseException, which libraries'
  `except Exception` cannot swallow (math-verify has such handlers), scores 0 and counts as a
  timeout (G of them for a group call). An async reward runs in an event loop of its own
  (`asyncio.run`) under the same timer.
- A call that raises `Contained(reason)` (the built-in `code_tests` reward, when a limit of the
  sandbox ended the completion's program: producer/sandbox/code_reward.py) scores 0 and counts
  under its reason, apart from errors and timeouts: the completion misbehaved, not the reward.
- A reward that takes a column its row lacks fails that call (an error saying which); so does
  every call of a reward that reads columns when the lease's columns are not a JSON object (the
  decoder checks their shape; only the reward workers parse them, so a broken one costs calls,
  not the producer).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import math
import numbers
import signal
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from producer.rewards.builtins import RewardFn
from producer.rewards.calls import CallPlan, MissingColumn, call_arguments, plan_call, resolve
from producer.sandbox.code_reward import Contained

OK, ERROR, TIMEOUT, CONTAINED = 0, 1, 2, 3
KINDS = {ERROR: "error", TIMEOUT: "timeout", CONTAINED: "contained"}
_armed = False  # the alarm raises only while a reward call runs
Outcome = tuple[float, int, str]  # (value, OK | ERROR | TIMEOUT, what went wrong)
Failure = tuple[str, str, str]  # (spec, "error" | "timeout" | "contained", what went wrong)
Table = tuple[list[list[float]], int, int, list[Failure], dict[str, int]]  # score_group's


@dataclass(frozen=True, slots=True)
class RowData:
    """What rewards read of a lease's row (sent to a worker with each group)."""

    prompt: str | list[dict[str, str]]  # the text, or the chat messages
    answer: str
    columns: str = ""  # the other columns, a JSON object's text ("" = none)


class _CallTimeout(BaseException):
    """Raised into a reward call by the alarm. Not an Exception: `except Exception` can't eat it."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    if _armed:
        raise _CallTimeout


def init_worker(specs: list[str]) -> None:
    """A new worker: the alarm handler installed, every reward imported (outside any timer)."""
    signal.signal(signal.SIGALRM, _on_alarm)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    for spec in specs:
        _resolved(spec)


@functools.cache
def _resolved(spec: str) -> tuple[RewardFn, CallPlan]:
    fn = resolve(spec)
    return fn, plan_call(fn, spec)


def score_group(
    specs: list[str], completions: list[str], row: RowData, timeout_s: float | None
) -> Table:
    """Every spec on every completion: (table [spec][completion], errors, timeouts, the first
    failure of each kind per spec, contained calls by reason). `timeout_s` None: no timer (the
    inline built-ins, called in the producer's own thread)."""
    table: list[list[float]] = []
    outcomes: list[int] = []
    failures: dict[tuple[str, int], str] = {}
    contained: dict[str, int] = {}
    values: dict[bool, dict[str, Any] | str] = {}  # the row's arguments, parsed once
    for spec in specs:
        fn, plan = _resolved(spec)
        if plan.reads_columns not in values:
            values[plan.reads_columns] = _row_values(row, with_columns=plan.reads_columns)
        args = values[plan.reads_columns]
        if isinstance(args, str):  # the columns could not be read
            results: list[Outcome] = [(0.0, ERROR, args)] * len(completions)
        elif plan.per_group:
            results = _call_group(fn, plan, completions, args, timeout_s)
        else:
            results = [_call(fn, plan, text, args, timeout_s) for text in completions]
        table.append([value for value, _, _ in results])
        outcomes += [outcome for _, outcome, _ in results]
        for _, outcome, why in results:
            if outcome != OK:
                failures.setdefault((spec, outcome), why)
            if outcome == CONTAINED:
                contained[why] = contained.get(why, 0) + 1
    shown = [(spec, KINDS[outcome], why) for (spec, outcome), why in failures.items()]
    return table, outcomes.count(ERROR), outcomes.count(TIMEOUT), shown, contained


def _row_values(row: RowData, *, with_columns: bool) -> dict[str, Any] | str:
    """The arguments a reward may take of the row, or what is wrong with its columns."""
    out: dict[str, Any] = {"prompt": row.prompt, "answer": row.answer}
    if not with_columns or not row.columns:
        return out
    try:
        columns = json.loads(row.columns)
    except (ValueError, RecursionError) as exc:
        return f"could not read the lease's columns ({type(exc).__name__}: {_short(str(exc))})"
    if not isinstance(columns, dict):
        return "could not read the lease's columns (not a JSON object)"
    return {**columns, **out}  # the consumer refuses columns named prompt or answer


def _call(
    fn: RewardFn, plan: CallPlan, completion: str, row: dict[str, Any], timeout_s: float | None
) -> Outcome:
    """One call on one completion, under its own timer unless `timeout_s` is None."""
    try:
        args, kwargs = call_arguments(plan, completion, row)
    except MissingColumn as exc:
        return 0.0, ERROR, str(exc)
    value, outcome, why = timed(lambda: fn(*args, **kwargs), timeout_s)
    return _number(value) if outcome == OK else (0.0, outcome, why)


def _call_group(
    fn: RewardFn,
    plan: CallPlan,
    completions: list[str],
    row: dict[str, Any],
    timeout_s: float | None,
) -> list[Outcome]:
    """One call on the whole group (G completions), under a timer of G calls."""
    G = len(completions)
    try:
        args, kwargs = call_arguments(plan, list(completions), row)
    except MissingColumn as exc:
        return [(0.0, ERROR, str(exc))] * G
    limit = None if timeout_s is None else timeout_s * G
    values, outcome, why = timed(lambda: fn(*args, **kwargs), limit)
    if outcome != OK:
        return [(0.0, outcome, why)] * G
    if not isinstance(values, list | tuple | np.ndarray) or len(values) != G:
        why = f"returned {_short(repr(values))}, not a list of {G} numbers (one per completion)"
        return [(0.0, ERROR, why)] * G
    return [_number(v) for v in values]


def timed(
    call: Callable[[], Any], timeout_s: float | None, *, key: str = "rewards.timeout_s"
) -> tuple[Any, int, str]:
    """Run `call` (awaiting what it returns, if awaitable) under an alarm of `timeout_s` (the
    config `key` that sets it, for the message); also the environments' timer
    (producer/episodes/calls.py)."""
    global _armed
    try:
        if timeout_s is None:
            return _awaited(call()), OK, ""
        _armed = True
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return _awaited(call()), OK, ""
        finally:
            _armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _CallTimeout:
        return None, TIMEOUT, f"timed out after {timeout_s:g} s ({key})"
    except Contained as exc:
        return None, CONTAINED, exc.reason
    except (Exception, SystemExit) as exc:  # a user's reward failing is data, not a crash
        return None, ERROR, f"raised {type(exc).__name__}: {_short(str(exc))}{_raised_at(exc)}"


def _raised_at(exc: BaseException) -> str:
    """` (closeness.py, line 12: return int(answer))`: where the innermost frame of `exc`'s
    traceback raised it, so a one-line report names the reward's own line."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    line = f": {_short(frame.line, 80)}" if frame.line else ""
    return f" ({Path(frame.filename).name}, line {frame.lineno}{line})"


def _awaited(value: Any) -> Any:
    """`value`, or what it resolves to when it is awaitable (an async reward's coroutine)."""
    if not inspect.isawaitable(value):
        return value

    async def wait(awaitable: Awaitable[Any]) -> Any:
        return await awaitable

    return asyncio.run(wait(value))


def _number(value: Any) -> Outcome:
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return float(value), OK, ""
    why = f"returned {_short(repr(value))} ({type(value).__name__}), not a finite number"
    return 0.0, ERROR, why


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
