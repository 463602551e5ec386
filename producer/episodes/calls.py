"""One environment call: the environment resolved from its spec, called by name under its timer,
its return value checked (producer/episodes/contract.py). Runs in an environment worker process
(producer/episodes/runner.py spawns them) or, for the built-ins, in the producer itself.

- `resolve_env(spec)`: a built-in name (`BUILTINS`) or `"module:function"`, imported with
  importlib; a `ConfigError` naming `episodes.env` when it cannot be found, is not callable, or
  takes a parameter without a default that no call can give (neither an argument name of the
  contract nor a possible column: a positional-only one).
- `call_env(spec, call, timeout_s)`: one call with `call`'s arguments (`EnvCall`: the reply, the
  conversation, the turn, the episode's state, the row), awaited if it returns an awaitable,
  under an ITIMER_REAL alarm of `timeout_s` (None: no timer, the built-ins) that a library's
  `except Exception` cannot swallow (producer/rewards/worker.py `timed`). The result, an
  `Outcome`, carries the state as the call left it. A call that raises, times out, takes a
  column the row lacks, or returns something the contract does not allow is an `Outcome` of kind
  "error", "timeout" or "bad_return" with the reason in a line; nothing here raises for a bad
  environment.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.errors import ConfigError
from producer.episodes.contract import End, Next, Reply, normalise
from producer.episodes.guess import guess
from producer.rewards.calls import import_callable
from producer.rewards.worker import CONTAINED, ERROR, OK, TIMEOUT, timed

BUILTINS: dict[str, Callable[..., Any]] = {"guess": guess}
CONTRACT = ("reply", "messages", "turn", "turns_left", "state", "prompt", "answer")


@dataclass(frozen=True, slots=True)
class EnvCall:
    """The arguments of one call (pickled to a worker)."""

    reply: Reply
    messages: list[dict[str, str]]
    turn: int
    turns_left: int
    state: dict[str, Any]
    prompt: str | list[dict[str, str]]
    answer: str
    columns: str = ""  # the row's other columns, a JSON object's text ("" = none)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one call gave: its kind, the next messages or the end, the state it left."""

    kind: str  # "next" | "end" | "error" | "timeout" | "bad_return"
    result: Next | End | None = None
    state: dict[str, Any] = field(default_factory=dict)
    why: str = ""  # what went wrong (kinds error, timeout, bad_return)
    wall_s: float = 0.0  # the call's wall time in the producer (simulated latency included)


def resolve_env(spec: str) -> Callable[..., Any]:
    """The environment function `spec` names (the module docstring); `ConfigError` if none."""
    if spec in BUILTINS:
        return BUILTINS[spec]
    fn = import_callable(spec, "episodes.env", "environment", BUILTINS)
    _parameters(fn, spec)
    return fn  # type: ignore[no-any-return]


def _parameters(fn: Callable[..., Any], spec: str) -> tuple[tuple[str, ...], bool]:
    """(the parameters given by name, whether it takes **kwargs); `ConfigError` for a
    positional-only parameter without a default (no call could give it)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise ConfigError(f"episodes.env: {spec!r} has no signature to read") from None
    kinds = inspect.Parameter
    for p in params:
        if p.kind in (kinds.POSITIONAL_ONLY, kinds.VAR_POSITIONAL) and p.default is p.empty:
            raise ConfigError(
                f"episodes.env: {spec!r}: parameter {p.name!r} cannot be given by name; an "
                "environment's parameters are named (reply, messages, turn, turns_left, state, "
                "prompt, answer, or a column of the row): docs/episodes.md"
            )
    named = tuple(
        p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
    )
    return named, any(p.kind == kinds.VAR_KEYWORD for p in params)


@functools.cache
def _resolved(spec: str) -> tuple[Callable[..., Any], tuple[str, ...], bool]:
    fn = resolve_env(spec)
    return (fn, *_parameters(fn, spec))


def init_env_worker(spec: str) -> None:
    """A new environment worker: the alarm handler installed, the environment imported."""
    from producer.rewards.worker import init_worker

    init_worker([])
    _resolved(spec)


def call_env(spec: str, call: EnvCall, timeout_s: float | None) -> Outcome:
    """One call of the environment `spec` (the module docstring)."""
    fn, names, var_keyword = _resolved(spec)
    state = dict(call.state)
    values: dict[str, Any] = {
        "reply": call.reply,
        "messages": [dict(m) for m in call.messages],
        "turn": call.turn,
        "turns_left": call.turns_left,
        "state": state,
        "prompt": call.prompt,
        "answer": call.answer,
    }
    if call.columns and (var_keyword or any(n not in CONTRACT for n in names)):
        try:
            columns = json.loads(call.columns)
        except (ValueError, RecursionError) as exc:
            return Outcome("error", why=f"could not read the lease's columns ({exc})")
        if isinstance(columns, dict):
            values = {**columns, **values}
    kwargs = {n: values[n] for n in names if n in values}
    missing = [n for n in names if n not in values and not _has_default(fn, n)]
    if missing:
        return Outcome("error", why=f"takes {missing[0]!r}, which this row does not have")
    if var_keyword:
        kwargs.update((k, v) for k, v in values.items() if k not in kwargs)
    value, status, why = timed(lambda: fn(**kwargs), timeout_s, key="episodes.timeout_s")
    if status == TIMEOUT:
        return Outcome("timeout", state=state, why=why)
    if status in (ERROR, CONTAINED):  # CONTAINED: it let the sandbox's verdict escape
        return Outcome("error", state=state, why=why)
    assert status == OK
    result = normalise(value)
    if isinstance(result, str):
        return Outcome("bad_return", state=state, why=result)
    return Outcome("end" if isinstance(result, End) else "next", result, state)


def _has_default(fn: Callable[..., Any], name: str) -> bool:
    return inspect.signature(fn).parameters[name].default is not inspect.Parameter.empty
