"""Reward functions that misbehave on purpose, used as 'reward_fixtures:NAME' in tests.

A plain module: `tests/` is on sys.path through conftest, and the reward runner's spawn workers
inherit the parent's sys.path, so they import it too.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np


def raises(completion: str, answer: str) -> float:
    raise RuntimeError("this reward is broken")


def exits(completion: str, answer: str) -> float:
    raise SystemExit(3)


def hangs_on_hang(completion: str, answer: str) -> float:
    """Hangs on the completion 'hang'; otherwise 1.0."""
    if completion == "hang":
        time.sleep(60)
    return 1.0


def hangs_hard_on_hang(completion: str, answer: str) -> float:
    """On 'hang': ignores the worker's alarm and hangs, like a reward stuck in C code; else 1.0."""
    if completion == "hang":
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        time.sleep(60)
    return 1.0


def kills_worker(completion: str, answer: str) -> float:
    """Takes its worker process down, like a segfault in an extension."""
    os._exit(1)


def nan(completion: str, answer: str) -> float:
    return float("nan")


def inf(completion: str, answer: str) -> float:
    return float("inf")


def not_a_number(completion: str, answer: str) -> float:
    return "yes"  # type: ignore[return-value]


def numpy_half(completion: str, answer: str) -> float:
    return np.float32(0.5)  # type: ignore[return-value]


def is_answer(completion: str, answer: str) -> float:
    return completion == answer  # a bool: counts as 0/1


def length(completion: str, answer: str) -> float:
    return float(len(completion))


not_callable = 3


def sum_is_right(completion: str, answer: str) -> float:
    """1.0 when the completion is the answer (the synthetic sums) up to surrounding spaces."""
    return float(completion.strip() == answer.strip())
