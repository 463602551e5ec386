"""How a reward function is found and called: `resolve` a spec (a built-in name,
producer/rewards/builtins.py, or `"module:function"`, imported with importlib), and
`plan_call`/`call_arguments`: how its signature says it is called.

The calling convention (`plan_call`: the function's signature decides, once, at startup):
- By name, when a parameter is named `completion` or `completions`, or the function takes
  `**kwargs`. Each parameter gets the argument of its name: `completion` (the completion's
  text, the prompt excluded), `prompt` (the row's prompt: text, or the chat messages as a list
  of `{"role", "content"}` dicts), `answer` (the reference answer's text; "" when the task has
  none), or any other column of the row (JSON values: text, numbers, booleans, null, lists,
  dicts). `**kwargs` receives every argument no parameter names. A parameter with a default
  keeps it when the row has no such column; one without a default makes the call fail
  (counted and logged as an error, like any failing call).
- Per group, when a parameter is named `completions`: one call per group gets the list of its
  G completions and returns G numbers (a list, tuple or NumPy array), e.g. to reward
  diversity, or to score the group in one batch. Otherwise one call per completion returns one
  number.
- Positionally, `fn(completion, answer)`, for a function with none of those names and no
  `**kwargs` (the original convention: `def reward(text, ref)` keeps working).
- `async def` functions (or any call that returns an awaitable) are awaited, each call in an
  event loop of its own in the reward worker (producer/rewards/worker.py).
A signature that fits none of these (both `completion` and `completions`; fewer than two
positional parameters without the names; a positional-only parameter without a default beside
named ones) is refused by `plan_call` with a `ConfigError` that names the reward.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError
from producer.rewards.builtins import BUILTINS, RewardFn

ROW_ARGUMENTS = ("prompt", "answer")  # given by name besides the row's other columns


def resolve(spec: str) -> RewardFn:
    """A built-in name or 'module:function' whose signature `plan_call` accepts; `ConfigError`
    naming rewards.fns otherwise."""
    if spec in BUILTINS:
        return BUILTINS[spec]
    fn = import_callable(spec, "rewards.fns", "reward", BUILTINS)
    plan_call(fn, spec)
    return fn  # type: ignore[no-any-return]


def import_callable(spec: str, key: str, what: str, builtins: Mapping[str, Any]) -> Any:
    """The callable 'module:function' `spec` names, imported on this host; `ConfigError` naming
    the config `key` (and the `builtins` one might have meant) when it cannot be. Also the
    environments' (producer/episodes/calls.py)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ConfigError(
            f"{key}: unknown {what} {spec!r}; use one of {', '.join(builtins)} or 'module:function'"
        )
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"{key}: cannot import {spec!r} on this producer's host ({exc}); the module "
            "must be importable there (installed, or its directory on PYTHONPATH)"
        ) from None
    except Exception as exc:  # the user's module raised at import: its error, in one line
        raise ConfigError(f"{key}: importing {spec!r} raised {type(exc).__name__}: {exc}") from exc
    if not callable(fn):
        raise ConfigError(f"{key}: {spec!r} is not callable")
    return fn


class MissingColumn(LookupError):
    """A reward takes an argument that the row does not have (a failed call, not a crash)."""


@dataclass(frozen=True, slots=True)
class CallPlan:
    """How one reward function is called (see the module doc)."""

    per_group: bool  # takes `completions`: one call per group, G numbers back
    positional: bool  # the original convention: fn(completion, answer)
    names: tuple[str, ...]  # the parameters given by name
    required: frozenset[str]  # those of `names` without a default
    var_keyword: bool  # **kwargs: gets every argument no parameter names

    @property
    def reads_columns(self) -> bool:
        """Whether a call may need the row's other columns."""
        known = {"completion", "completions", *ROW_ARGUMENTS}
        return self.var_keyword or any(n not in known for n in self.names)


def plan_call(fn: RewardFn, spec: str) -> CallPlan:
    """The calling convention of `fn`, from its signature; `ConfigError` naming `spec` if it
    fits none."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (some C functions): the original way
        return CallPlan(False, True, (), frozenset(), False)
    kinds = inspect.Parameter
    named = [p for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)]
    names = tuple(p.name for p in named)
    var_keyword = any(p.kind == kinds.VAR_KEYWORD for p in params)
    if "completion" in names and "completions" in names:
        raise ConfigError(
            f"rewards.fns: {spec!r} takes both 'completion' and 'completions'; take one (each "
            "completion, or the whole group)"
        )
    if "completion" in names or "completions" in names or var_keyword:
        only = kinds.POSITIONAL_ONLY
        unnamed = [p.name for p in params if p.kind == only and p.default is p.empty]
        if unnamed:
            raise ConfigError(
                f"rewards.fns: {spec!r}: positional-only parameter {unnamed[0]!r} cannot be "
                "given by name"
            )
        required = frozenset(p.name for p in named if p.default is p.empty)
        return CallPlan("completions" in names, False, names, required, var_keyword)
    by_place = (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    positional = [p for p in params if p.kind in by_place]
    takes_two = len(positional) >= 2 or any(p.kind == kinds.VAR_POSITIONAL for p in params)
    needs_more = [p for p in positional[2:] if p.default is p.empty]
    if not takes_two or needs_more:
        raise ConfigError(
            f"rewards.fns: {spec!r} must take 'completion' (or 'completions', for a whole group) "
            "by name, or be fn(completion, answer); see docs/custom_task/README.md"
        )
    return CallPlan(False, True, (), frozenset(), False)


def call_arguments(
    plan: CallPlan, completion: str | list[str], row: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) of one call: `completion` (one text, or the group's list for a per-group
    plan) and `row` (prompt, answer and the other columns). `MissingColumn` naming what the row
    lacks."""
    if plan.positional:
        return (completion, row["answer"]), {}
    values = {**row, ("completions" if plan.per_group else "completion"): completion}
    kwargs = {name: values[name] for name in plan.names if name in values}
    missing = sorted(plan.required - kwargs.keys())
    if missing:
        columns = [k for k in row if k not in ROW_ARGUMENTS]
        raise MissingColumn(
            f"takes {missing[0]!r}, which is not a column of this row (its columns: "
            f"{', '.join(columns) or 'none besides prompt and answer'})"
        )
    if plan.var_keyword:
        kwargs.update((k, v) for k, v in values.items() if k not in kwargs)
    return (), kwargs
