"""The environment contract: what an environment is given each turn and what it may return.

An environment is a function (sync or `async def`), named by `episodes.env` as a built-in or
`"module:function"`. After every model turn of an episode it is called once, its parameters
given by name (any subset, in any order; `**kwargs` takes every argument no parameter names):

- `reply`: the assistant message just sampled, a `Reply` (`text`, special tokens dropped; `ids`,
  the token ids exactly as sampled; `finish_reason`, "stop" or "length");
- `messages`: the conversation so far as `{"role", "content"}` dicts, ending with that reply;
- `turn`: the number of that model turn (1 for the first); `turns_left`: model turns still
  allowed after it (0 on the last: whatever the environment returns then but `End` ends the
  episode as `max_turns`);
- `state`: a dict of the episode's own, empty at its start, kept between the calls of one
  episode (what the environment stores there must pickle: calls may run in worker processes);
- `prompt`, `answer` and the row's other columns, as reward functions get them.

It returns the next messages, or the end:
- a string: one user message with that content;
- a message dict (`{"role": ..., "content": ...}`, e.g. role "tool" for a tool's result) or a
  list of them (at least one);
- `End(reward)`: the episode is over; `reward` a finite number is the episode's reward, `None`
  leaves it to the run's reward functions (`rewards.fns`), which then score the last assistant
  message as `completion` with the whole conversation before it as `prompt`.
Anything else (a number, an empty list, a message without a string content) ends the episode as
an environment error, as does raising or outliving `episodes.timeout_s` (producer/episodes/
runner.py). A function may carry the tools it dispatches (`@environment(tools=[...])`): the
prompt then describes them (producer/episodes/tools.py).

Pure: no I/O, no torch. `normalise` turns a return value into `Next` or `End`, or says why it
cannot.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Reply:
    """The assistant message an environment answers."""

    text: str  # decoded, special tokens dropped
    ids: tuple[int, ...]  # exactly the tokens the model sampled
    finish_reason: str  # "stop" (a stop token ended it, included in ids) or "length"


@dataclass(frozen=True, slots=True)
class End:
    """The end of an episode: its reward, or None to let the run's reward functions score it."""

    reward: float | None = None


@dataclass(frozen=True, slots=True)
class Next:
    """The environment's next messages, to append to the episode (at least one)."""

    messages: tuple[tuple[str, str], ...]  # (role, content)


@dataclass(frozen=True, slots=True)
class Environment:
    """What `@environment` attaches to a function: the tools it dispatches."""

    tools: tuple[Callable[..., Any], ...] = field(default_factory=tuple)


def environment(*, tools: Sequence[Callable[..., Any]] = ()) -> Callable[[Any], Any]:
    """Declare the tools an environment function dispatches (their names, signatures and
    docstrings describe them to the model: producer/episodes/tools.py)."""

    def mark(fn: Any) -> Any:
        fn.__asyncgrpo_environment__ = Environment(tuple(tools))
        return fn

    return mark


def tools_of(fn: Any) -> tuple[Callable[..., Any], ...]:
    """The tools an environment function was declared with (none by default)."""
    declared = getattr(fn, "__asyncgrpo_environment__", None)
    return declared.tools if isinstance(declared, Environment) else ()


def normalise(value: Any) -> Next | End | str:
    """`Next` or `End` for what an environment returned, or the reason it is neither."""
    if isinstance(value, End):
        reward = value.reward
        if reward is None:
            return value
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
            return f"returned End({_short(repr(reward))}), whose reward is not a number"
        if not math.isfinite(reward):
            return f"returned End({reward!r}), a reward that is not finite"
        return End(float(reward))
    if isinstance(value, str):
        return Next((("user", value),))
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list | tuple) or not items:
        return (
            f"returned {_short(repr(value))} ({type(value).__name__}): return a string, a "
            "message dict, a non-empty list of them, or End(reward)"
        )
    out = []
    for item in items:
        if not isinstance(item, dict):
            return f"returned a list holding {type(item).__name__}, not message dicts"
        role, content = item.get("role"), item.get("content")
        if not isinstance(role, str) or not role or not isinstance(content, str):
            return f"returned a message without a role and a string content: {_short(repr(item))}"
        out.append((role, content))
    return Next(tuple(out))


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
