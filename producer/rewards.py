"""Verifiable rewards and the runner that keeps bad reward functions from hurting the producer.

A reward function is `fn(completion: str, answer: str) -> float`. Built-ins:
- `exact_match`: 1.0 when the completion, whitespace-stripped, equals the answer (stripped).
- `math_verify`: the `math-verify` library: the answer in the completion's last `\\boxed{…}`
  (else the whole text) is parsed and checked for mathematical equivalence with the reference.
- `boxed_format`: 1.0 when the completion contains a `\\boxed{…}` (a small format reward).
Anything else is `"module:function"`, imported on the producer.

`RewardRunner` scores one group per round trip to a process pool (spawn context: nothing of the
producer's torch state is forked). Invariants:
- A reward that raises, or returns a non-number or a non-finite value, scores 0 for that
  completion and counts as an error; the others in the group are unaffected.
- A reward that runs longer than `timeout_s` is interrupted inside the worker (SIGALRM timer),
  scores 0 and counts as a timeout. If a whole group call outlives its hard deadline (a reward
  stuck in C code), the pool is killed and rebuilt and the group scores 0: the producer never
  waits forever and never crashes.
- Specs are resolved in the parent at construction, so a typo fails at startup.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import multiprocessing
import re
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.config import RewardSpec
from common.errors import ConfigError

RewardFn = Callable[[str, str], float]
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*)\}")


def exact_match(completion: str, answer: str) -> float:
    return float(completion.strip() == answer.strip())


def _last_boxed(text: str) -> str | None:
    found = _BOXED.findall(text)
    return found[-1] if found else None


def math_verify(completion: str, answer: str) -> float:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # we enforce timeouts ourselves
    boxed = _last_boxed(completion)
    target = f"${boxed}$" if boxed is not None else completion
    gold = parse(f"${answer}$", parsing_timeout=None)
    pred = parse(target, parsing_timeout=None)
    if not gold or not pred:
        return 0.0
    return float(verify(gold, pred, timeout_seconds=None))


def boxed_format(completion: str, answer: str) -> float:
    return float(_last_boxed(completion) is not None)


BUILTINS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "math_verify": math_verify,
    "boxed_format": boxed_format,
}


def resolve(spec: str) -> RewardFn:
    """A built-in name or 'module:function'; ConfigError naming rewards.fns otherwise."""
    if spec in BUILTINS:
        return BUILTINS[spec]
    module, sep, name = spec.partition(":")
    if not sep:
        raise ConfigError(
            f"rewards.fns: unknown reward {spec!r}; use one of {', '.join(BUILTINS)} or 'module:function'"
        )
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"rewards.fns: cannot import {spec!r} ({exc})") from None
    if not callable(fn):
        raise ConfigError(f"rewards.fns: {spec!r} is not callable")
    return fn  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True, eq=False)
class Scored:
    rewards: np.ndarray  # float32 [G], weighted sum
    parts: dict[str, np.ndarray]  # per reward spec, float32 [G]
    num_errors: int
    num_timeouts: int


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def _score_in_worker(
    specs: list[str], completions: list[str], answer: str, timeout_s: float
) -> tuple[list[list[float]], int, int]:
    """Runs in a pool process: every spec on every completion, each call under its own timer."""
    signal.signal(signal.SIGALRM, _alarm)
    table, errors, timeouts = [], 0, 0
    for spec in specs:
        fn = resolve(spec)
        row = []
        for text in completions:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                value = fn(text, answer)
                signal.setitimer(signal.ITIMER_REAL, 0)
                ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
                row.append(float(value) if ok else 0.0)
                errors += not ok
            except _Timeout:
                row.append(0.0)
                timeouts += 1
            except Exception:  # a user's reward failing is data, not a producer crash
                signal.setitimer(signal.ITIMER_REAL, 0)
                row.append(0.0)
                errors += 1
        table.append(row)
    return table, errors, timeouts


class RewardRunner:
    def __init__(
        self, specs: list[RewardSpec], *, timeout_s: float, workers: int, hard_margin_s: float = 10.0
    ) -> None:
        for s in specs:
            resolve(s.fn)
        self.specs = specs
        self.timeout_s = timeout_s
        self.workers = workers
        self.hard_margin_s = hard_margin_s  # beyond timeout_s per call: then the pool is killed
        self.num_calls = self.num_errors = self.num_timeouts = self.num_pool_restarts = 0
        self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))

    async def score(self, completions: list[str], answer: str) -> Scored:
        names = [s.fn for s in self.specs]
        calls = len(names) * len(completions)
        self.num_calls += calls
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._pool, _score_in_worker, names, completions, answer, self.timeout_s)
        try:
            async with asyncio.timeout(self.timeout_s * calls + self.hard_margin_s):
                table, errors, timeouts = await future
        except TimeoutError:
            self._restart_pool()
            table, errors, timeouts = [[0.0] * len(completions) for _ in names], 0, calls
        self.num_errors += errors
        self.num_timeouts += timeouts
        parts = {name: np.asarray(row, np.float32) for name, row in zip(names, table, strict=True)}
        total = np.zeros(len(completions), np.float32)
        for spec, row in zip(self.specs, table, strict=True):
            total += np.float32(spec.weight) * np.asarray(row, np.float32)
        return Scored(total, parts, errors, timeouts)

    def _restart_pool(self) -> None:
        self.num_pool_restarts += 1
        for proc in list(getattr(self._pool, "_processes", {}).values()):
            proc.kill()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._new_pool()

    def close(self) -> None:
        for proc in list(getattr(self._pool, "_processes", {}).values()):
            proc.kill()
        self._pool.shutdown(wait=False, cancel_futures=True)
