"""Environments for multi-turn episodes, well-behaved and misbehaving on purpose, used as
'env_fixtures:NAME' (`episodes.env`) in tests. A plain module: `tests/` is on sys.path through
conftest, and the environment workers (spawned) inherit the parent's sys.path.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from producer.episodes import End, Reply, environment


def echo(reply: Reply, turn: int, turns_left: int, state: dict[str, Any]) -> End | str:
    """Answers every turn with "turn N", counting in `state`; ends after turn 3 with reward
    turn / 10 (never on its own before)."""
    state["seen"] = state.get("seen", 0) + 1
    assert state["seen"] == turn, "the state is kept between the calls of one episode"
    if turn >= 3:
        return End(turn / 10)
    return f"turn {turn}"


def chatty(turn: int) -> list[dict[str, str]]:
    """Never ends: a user message and a tool message every turn (max_turns ends it)."""
    return [{"role": "user", "content": f"more {turn}"}, {"role": "tool", "content": "42"}]


def leaves_reward(turn: int) -> End | str:
    """Ends at turn 2 and leaves the reward to the reward functions."""
    return End() if turn == 2 else "again"


async def slow_async(turn: int) -> End | str:
    """An async environment: awaits a little, ends at turn 2 with reward 1."""
    await asyncio.sleep(0.01)
    return End(1.0) if turn == 2 else "again"


def by_column(reply: Reply, target: str, bonus: float = 0.0) -> End:
    """Reads the row's `target` column: reward 1 + bonus when the reply equals it."""
    return End(float(reply.text.strip() == target) + bonus)


def raises(turn: int) -> str:
    raise RuntimeError("this environment is broken")


def raises_on_turn_2(turn: int) -> str:
    if turn == 2:
        raise ValueError("turn two breaks it")
    return "go on"


def hangs(turn: int) -> str:
    time.sleep(60)
    return "late"


def hangs_hard(turn: int) -> str:
    """Ignores the worker's alarm, like an environment stuck in C code."""
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(60)
    return "late"


def kills_worker(turn: int) -> str:
    os._exit(7)


def returns_number(turn: int) -> float:
    return 3.0


def returns_nothing(turn: int) -> list[Any]:
    return []


def returns_bad_message(turn: int) -> dict[str, Any]:
    return {"role": "user", "content": 5}


def nan_reward(turn: int) -> End:
    return End(float("nan"))


def floods(turn: int) -> str:
    """An answer far longer than any episode's token budget."""
    return "x" * 100_000


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@environment(tools=[multiply])
def calculator(reply: Reply, answer: str, messages: list[dict[str, str]]) -> Any:
    """Runs the model's tool calls; a reply without one is its final answer."""
    from producer.episodes.tools import dispatch

    results = dispatch(reply.text, [multiply])
    if results is not None:
        return results
    return End(float(reply.text.strip() == answer))


def flaky_length(reply: Reply, turn: int) -> End | str:
    """Three turns, reward the last reply's length / 10; raises on a second turn whose reply
    has a multiple of 3 tokens (some episodes of most groups)."""
    if turn == 2 and len(reply.ids) % 3 == 0:
        raise RuntimeError("flaky on purpose")
    if turn == 3:
        return End(len(reply.ids) / 10)
    return f"turn {turn}"
