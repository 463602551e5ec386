"""Verifiable rewards, and the runner that keeps bad reward functions from hurting the producer.

A reward function is pure: `fn(completion: str, answer: str) -> float`. Built-ins:
- `exact_match`: 1.0 when the completion, whitespace-stripped, equals the answer, stripped
  (`common.tasks.is_correct`, the rule of the built-in synthetic task).
- `math_verify`: the `math-verify` library. The completion's answer is the content of its last
  `\\boxed{…}`, else its last number (`-3`, `2.5`, `1/2`); it and the reference are parsed as
  LaTeX and compared for mathematical equivalence (`\\boxed{1/2}` matches `0.5`).
- `boxed_format`: 1.0 when the completion contains a non-empty `\\boxed{…}` (a format reward).
Anything else is `"module:function"`, imported with importlib (`resolve`).

`RewardRunner.score(completions, answer)` scores one group in one round trip to a process pool
(spawn context: a worker never inherits the producer's torch threads or CUDA state; spawn
workers do inherit `sys.path`). When every reward is a bounded built-in (`INLINE`:
`exact_match`, `boxed_format`: a string compare and a linear regex on a completion of at most
`sampling.max_new_tokens` tokens, which can neither hang nor crash the process), the group is
scored in the producer itself and no pool is started: the same values, counters and log lines,
without a process round trip per group (~0.8 ms of wall and ~1 ms of the producer's CPU).
The reward of completion i is `sum_k weight_k * fn_k(c_i, answer)`.
Invariants:
- A call that raises, or returns a non-number (bool counts as 0/1) or a non-finite value, scores
  0 for that (completion, fn) and counts as an error; the other calls are unaffected.
- A call that runs longer than `timeout_s` is interrupted in the worker (an ITIMER_REAL alarm
  raising a BaseException, which libraries' `except Exception` cannot swallow — math-verify has
  such handlers), scores 0 and counts as a timeout. math-verify's own signal timeouts are off.
- A group whose round trip outlives `timeout_s * calls + hard_margin_s` (a reward stuck in C
  code, or one that blocks SIGALRM) gets the pool's processes killed and a new pool started; the
  group scores 0 and every call counts as a timeout. A worker that dies (a reward calling
  `os._exit`, a segfault) likewise costs one new pool and the group's calls count as errors.
- At most `workers` groups are in the pool at once (the rest wait in asyncio), and a group waits
  for a new pool's workers to start before its clock runs: the deadline measures its own work,
  not time queued behind other groups or a worker's start-up.
- Specs are resolved in the parent at construction: a typo fails at startup, not in a worker.
- `num_calls`, `num_errors`, `num_timeouts`, `num_pool_restarts` are cumulative counters.
- Nothing fails silently: each failed call's reason (the exception and its message, the
  value returned, or the timeout) comes back from the worker, and the producer logs the first
  of each kind per reward at once, then at most one line every 10 s per kind
  (common/log_limit.py), with the counts; timeouts also say that they cost throughput. The
  counts reach the consumer in heartbeats (the dashboard, `asyncgrpo status`, summary.md).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import multiprocessing
import numbers
import re
import signal
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import FrameType, TracebackType

import numpy as np

from common.config import RewardSpec
from common.errors import ConfigError
from common.log_limit import LogLimiter
from common.tasks import is_correct

RewardFn = Callable[[str, str], float]
log = logging.getLogger("asyncgrpo.producer")
POOL_START_S = 60.0  # longest wait for a new pool's first worker (spawn + imports, e.g. sympy)

_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def exact_match(completion: str, answer: str) -> float:
    return float(is_correct(completion, answer))


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{…}` (braces nested up to two levels), else None."""
    found = _BOXED.findall(text)
    return found[-1] if found else None


def math_verify(completion: str, answer: str) -> float:
    from math_verify import parse, verify  # sympy: imported by the workers that use it

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": on purpose
    target = last_boxed(completion)
    if target is None:
        numbers_found = _NUMBER.findall(completion)
        target = numbers_found[-1] if numbers_found else None
    if not target or not answer.strip():
        return 0.0
    gold = parse(f"${answer}$", parsing_timeout=None)
    pred = parse(f"${target}$", parsing_timeout=None)
    return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None))


def boxed_format(completion: str, answer: str) -> float:
    return float(bool(last_boxed(completion)))


BUILTINS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "math_verify": math_verify,
    "boxed_format": boxed_format,
}
INLINE = frozenset({"exact_match", "boxed_format"})  # bounded: scored without a worker pool


def resolve(spec: str) -> RewardFn:
    """A built-in name or 'module:function'; `ConfigError` naming rewards.fns otherwise."""
    if spec in BUILTINS:
        return BUILTINS[spec]
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ConfigError(
            f"rewards.fns: unknown reward {spec!r}; use one of "
            f"{', '.join(BUILTINS)} or 'module:function'"
        )
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"rewards.fns: cannot import {spec!r} on this producer's host ({exc}); the module "
            "must be importable there (installed, or its directory on PYTHONPATH)"
        ) from None
    except Exception as exc:  # the user's module raised at import: its error, in one line
        raise ConfigError(
            f"rewards.fns: importing {spec!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(fn):
        raise ConfigError(f"rewards.fns: {spec!r} is not callable")
    return fn  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True, eq=False)
class Scored:
    rewards: np.ndarray  # float32 [G]: the weighted sum
    parts: dict[str, np.ndarray]  # float32 [G] per reward spec (unweighted)
    num_errors: int
    num_timeouts: int


# ---------------------------------------------------------------------------------------------
# Inside a pool worker

_OK, _ERROR, _TIMEOUT = 0, 1, 2
_armed = False  # the alarm raises only while a reward call runs


class _CallTimeout(BaseException):
    """Raised into a reward call by the alarm. Not an Exception: `except Exception` can't eat it."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    if _armed:
        raise _CallTimeout


def _init_worker(specs: list[str]) -> None:
    signal.signal(signal.SIGALRM, _on_alarm)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    for spec in specs:  # imports happen here, outside every call's timer
        resolve(spec)


def _call(
    fn: RewardFn, completion: str, answer: str, timeout_s: float | None
) -> tuple[float, int, str]:
    """One reward call, under its own timer unless `timeout_s` is None (an inline built-in):
    (value, _OK | _ERROR | _TIMEOUT, what went wrong)."""
    global _armed
    try:
        if timeout_s is None:
            value = fn(completion, answer)
        else:
            _armed = True
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                value = fn(completion, answer)
            finally:
                _armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
    except _CallTimeout:
        return 0.0, _TIMEOUT, f"timed out after {timeout_s:g} s (rewards.timeout_s)"
    except (Exception, SystemExit) as exc:  # a user's reward failing is data, not a crash
        return 0.0, _ERROR, f"raised {type(exc).__name__}: {_short(str(exc))}"
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return float(value), _OK, ""
    return (
        0.0,
        _ERROR,
        f"returned {_short(repr(value))} ({type(value).__name__}), not a finite number",
    )


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _score_group(
    specs: list[str], completions: list[str], answer: str, timeout_s: float | None
) -> tuple[list[list[float]], int, int, list[tuple[str, str, str]]]:
    """Every spec on every completion: (table [spec][completion], errors, timeouts, the first
    failure of each kind per spec as (spec, outcome, what went wrong)). `timeout_s` None: no
    timer (the inline built-ins, called in the producer's own thread)."""
    table: list[list[float]] = []
    outcomes: list[int] = []
    failures: dict[tuple[str, int], str] = {}
    for spec in specs:
        fn = resolve(spec)
        row = [_call(fn, text, answer, timeout_s) for text in completions]
        table.append([value for value, _, _ in row])
        outcomes += [outcome for _, outcome, _ in row]
        for _, outcome, why in row:
            if outcome != _OK:
                failures.setdefault((spec, outcome), why)
    kinds = {_ERROR: "error", _TIMEOUT: "timeout"}
    shown = [(spec, kinds[outcome], why) for (spec, outcome), why in failures.items()]
    return table, outcomes.count(_ERROR), outcomes.count(_TIMEOUT), shown


# ---------------------------------------------------------------------------------------------
# In the producer


class RewardRunner:
    """Scores groups in a pool of `workers` spawn processes, or inline when every reward is in
    `INLINE`; see the module docstring."""

    def __init__(
        self,
        specs: Sequence[RewardSpec],
        *,
        timeout_s: float,
        workers: int,
        hard_margin_s: float = 10.0,
    ) -> None:
        if not specs:
            raise ConfigError("rewards.fns needs at least one reward")
        for s in specs:
            resolve(s.fn)
            if not math.isfinite(s.weight):
                raise ConfigError(f"rewards.fns: weight of {s.fn!r} must be finite")
        assert timeout_s > 0, "config validation keeps rewards.timeout_s > 0"
        assert workers >= 1, "config validation keeps rewards.workers >= 1"
        self.specs = tuple(specs)
        self.names = part_names([s.fn for s in self.specs])
        self.timeout_s, self.workers, self.hard_margin_s = timeout_s, workers, hard_margin_s
        self.num_calls = self.num_errors = self.num_timeouts = self.num_pool_restarts = 0
        self._slots = asyncio.Semaphore(workers)
        self._log = LogLimiter(log)
        self._closed = False
        self.inline = all(s.fn in INLINE for s in self.specs)
        self._pool: ProcessPoolExecutor | None = None
        self._ready: Future[int] | None = None
        if not self.inline:
            self._pool, self._ready = self._start_pool()

    def _start_pool(self) -> tuple[ProcessPoolExecutor, Future[int]]:
        """A new pool, and a future done once a worker has started (imports included)."""
        ctx = multiprocessing.get_context("spawn")
        fns = sorted({s.fn for s in self.specs})
        pool = ProcessPoolExecutor(
            self.workers, mp_context=ctx, initializer=_init_worker, initargs=(fns,)
        )
        return pool, pool.submit(int)  # workers start now, not on the first group

    async def score(self, completions: list[str], answer: str) -> Scored:
        """Score one group: G completions against one reference answer."""
        assert not self._closed, "score() after close()"
        calls = len(self.specs) * len(completions)
        self.num_calls += calls
        if calls and self.inline:
            specs = [s.fn for s in self.specs]
            table, errors, timeouts, failures = _score_group(specs, completions, answer, None)
        elif calls:
            async with self._slots:
                table, errors, timeouts, failures = await self._round_trip(
                    completions, answer, calls
                )
        else:
            table, errors, timeouts, failures = [[] for _ in self.specs], 0, 0, []
        self.num_errors += errors
        self.num_timeouts += timeouts
        self._report(failures, errors, timeouts, len(completions))
        parts = {n: np.asarray(row, np.float32) for n, row in zip(self.names, table, strict=True)}
        total = np.zeros(len(completions), np.float32)
        for spec, name in zip(self.specs, self.names, strict=True):
            total += np.float32(spec.weight) * parts[name]
        return Scored(total, parts, errors, timeouts)

    def _report(
        self, failures: list[tuple[str, str, str]], errors: int, timeouts: int, size: int
    ) -> None:
        """Log failed reward calls with what went wrong: the first of each (reward, kind) at
        once, then at most one line every 10 s each, saying how many were held back."""
        for spec, kind, why in failures:
            self._log.log(
                f"{spec}.{kind}", logging.WARNING,
                "reward %r %s (scored 0; %d errors, %d timeouts in this group of %d; "
                "%d errors, %d timeouts so far)",
                spec, why, errors, timeouts, size, self.num_errors, self.num_timeouts,
            )  # fmt: skip
        if timeouts:
            self._log.log(
                "timeouts.cost", logging.WARNING,
                "rewards: %d calls timed out in one group, each holding a reward worker "
                "%.3g s (rewards.timeout_s): slow rewards cut this producer's throughput; "
                "raise rewards.workers or fix the reward",
                timeouts, self.timeout_s,
            )  # fmt: skip

    async def _round_trip(
        self, completions: list[str], answer: str, calls: int
    ) -> tuple[list[list[float]], int, int, list[tuple[str, str, str]]]:
        zeros = [[0.0] * len(completions) for _ in self.specs]
        specs = [s.fn for s in self.specs]
        for _ in range(2):  # a second try only if another group's failure replaced the pool
            assert self._pool is not None, "a pool runner"
            assert self._ready is not None, "a pool runner"
            if not self._ready.done():  # the deadline measures the group's work, not a start-up
                await asyncio.to_thread(futures.wait, [self._ready], POOL_START_S)
            if self._closed:
                break
            pool = self._pool
            try:
                job = pool.submit(_score_group, specs, completions, answer, self.timeout_s)
                async with asyncio.timeout(self.timeout_s * calls + self.hard_margin_s):
                    return await asyncio.wrap_future(job)
            except TimeoutError:
                self._replace_pool(pool, "a reward outlived its hard deadline")
                why = "outlived its hard deadline (stuck in C code, or blocking SIGALRM)"
                return zeros, 0, calls, [(s, "timeout", why) for s in specs]
            except BrokenProcessPool:
                if pool is self._pool:  # this group's reward took its worker down
                    self._replace_pool(pool, "a reward worker died")
                    why = "took its worker process down (os._exit, a crash in an extension)"
                    return zeros, calls, 0, [(s, "error", why) for s in specs]
        return zeros, calls, 0, [(s, "error", "not scored: the producer is closing") for s in specs]

    def _replace_pool(self, pool: ProcessPoolExecutor, why: str) -> None:
        if pool is not self._pool or self._closed:
            return
        log.warning("rewards: %s; restarting the reward worker pool", why)
        self.num_pool_restarts += 1
        _kill(pool)
        self._pool, self._ready = self._start_pool()

    def close(self) -> None:
        """Stop the workers now (rewards are pure: there is nothing to flush). Idempotent.

        A group still in flight scores 0 with its calls counted as errors.
        """
        self._closed = True
        if self._pool is not None:
            _kill(self._pool)

    async def __aenter__(self) -> RewardRunner:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def part_names(fns: list[str]) -> list[str]:
    """Keys of `Scored.parts`: the spec, with `#2`, `#3`… for repeats of the same spec."""
    out, seen = [], dict.fromkeys(fns, 0)
    for fn in fns:
        seen[fn] += 1
        out.append(fn if seen[fn] == 1 else f"{fn}#{seen[fn]}")
    return out


def _kill(pool: ProcessPoolExecutor) -> None:
    """Kill a pool's processes (a hung reward does not answer a polite shutdown) and reap them."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # no public API before 3.14
    pool.shutdown(wait=False)  # pending futures fail with BrokenProcessPool once they are dead
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(timeout=5)
