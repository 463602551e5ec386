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


# -- the calling conventions (producer/rewards/calls.py) -----------------------------------------
def within_tolerance(completion: str, answer: str, tolerance: float, unit: str) -> float:
    """Two columns by name: 1.0 when the completion is the answer (in `unit`) within `tolerance`."""
    number, _, got_unit = completion.strip().partition(" ")
    try:
        value = float(number)
    except ValueError:
        return 0.0
    return float(got_unit == unit and abs(value - float(answer)) <= tolerance)


def sees_everything(**row: object) -> float:
    """**kwargs only: called per completion with every argument; 1.0 if they are all there."""
    return float({"completion", "prompt", "answer", "unit", "tolerance"} <= row.keys())


def chat_turns(completion: str, prompt: object) -> float:
    """The prompt as rewards see it: the number of chat messages, or -1 for text."""
    return float(len(prompt)) if isinstance(prompt, list) else -1.0


def needs_a_column(completion: str, difficulty: int, bonus: float = 0.25) -> float:
    return float(difficulty) + bonus


def rank_in_group(completions: list[str], answer: str) -> list[float]:
    """Per group: 1/(1 + rank) of each completion by length; an answer match gets 10."""
    order = sorted(range(len(completions)), key=lambda i: len(completions[i]))
    out = [0.0] * len(completions)
    for rank, i in enumerate(order):
        out[i] = 10.0 if completions[i] == answer else 1.0 / (1 + rank)
    return out


def group_of_wrong_length(completions: list[str]) -> list[float]:
    return [1.0]


def group_with_a_nan(completions: list[str]) -> np.ndarray:
    out = np.ones(len(completions), np.float32)
    out[0] = np.nan
    return out


async def async_match(completion: str, answer: str) -> float:
    import asyncio

    await asyncio.sleep(0)
    return float(completion == answer)


async def async_hangs(completion: str) -> float:
    import asyncio

    await asyncio.sleep(60)
    return 1.0


async def async_group(completions: list[str], unit: str) -> list[float]:
    return [float(c.endswith(unit)) for c in completions]


def original_names(text: str, ref: str) -> float:
    """The original convention, with names of its own: called fn(completion, answer)."""
    return float(text == ref)
