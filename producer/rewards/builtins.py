"""The built-in reward functions, each `fn(completion, answer) -> float`, by name (`BUILTINS`:
what `rewards.fns` may name besides `module:function`, producer/rewards/calls.py).

- `exact_match`: 1.0 when the completion, whitespace-stripped, equals the answer, stripped
  (`common.task.synthetic.is_correct`, the rule of the built-in synthetic task).
- `math_verify`: the `math-verify` library. The completion's answer is the content of its last
  `\\boxed{…}`, else its last number (`-3`, `2.5`, `1/2`); it and the reference are parsed as
  LaTeX and compared for mathematical equivalence (`\\boxed{1/2}` matches `0.5`).
- `boxed_format`: 1.0 when the completion contains a non-empty `\\boxed{…}` (a format reward).
- `code_tests`: `fn(completion, tests)`: the fraction of the row's `tests` that the completion's
  Python code passes, run in the sandbox (producer/sandbox/code_reward.py, docs/sandbox.md).
`INLINE` names the bounded ones (a string compare, a linear regex): the runner scores them in
the producer itself, without a worker pool (producer/rewards/runner.py).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from common.task.synthetic import is_correct
from producer.sandbox.code_reward import code_tests

RewardFn = Callable[..., Any]
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
    "code_tests": code_tests,
}
INLINE = frozenset({"exact_match", "boxed_format"})  # bounded: scored without a worker pool
