"""Reward functions that misbehave on purpose (used as 'reward_fixtures:NAME' in tests)."""

from __future__ import annotations

import time


def raises(completion: str, answer: str) -> float:
    raise RuntimeError("this reward is broken")


def hangs(completion: str, answer: str) -> float:
    time.sleep(60)
    return 1.0


def nan(completion: str, answer: str) -> float:
    return float("nan")


def not_a_number(completion: str, answer: str) -> float:
    return "yes"  # type: ignore[return-value]


def length(completion: str, answer: str) -> float:
    return float(len(completion))


not_callable = 3


def hangs_hard(completion: str, answer: str) -> float:
    """Ignores the worker's alarm, like a reward stuck in C code."""
    import signal

    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(60)
    return 1.0
