"""The built-in multi-turn task (`episodes.env = "guess"`): answer, hear "too high" or "too low",
answer again.

On the built-in synthetic task (common/task/synthetic.py: `07+45=` → `052`) or any row whose
answer is an integer. After each model turn:
- a right answer (`is_correct`, the single-turn rule: equal after stripping whitespace) ends the
  episode with reward `DISCOUNT ** (turn - 1)`: 1 at the first turn, 0.8 at the second, 0.64 at
  the third;
- a wrong one on the last turn (`turns_left == 0`) ends it with reward 0;
- otherwise the environment answers with a hint and the problem again, `"{hint} {prompt}"`:
  hint `-` when the answer read as an integer is too high, `+` when it is too low, `*` when it is
  not an integer (the demo model's tokenizer knows digits, `+-*=` and space, nothing else), e.g.
  `+ 07+45=` after `042`.
So a model that can use the hint (the demo model's usual mistake, a dropped carry, is always
too low) gains on the later turns, and one that cannot still gets another try. Pure, bounded and
trusted: the producer calls it in its own process, without a worker (producer/episodes/runner.py).
"""

from __future__ import annotations

from typing import Any

from common.task.synthetic import is_correct
from producer.episodes.contract import End, Reply

DISCOUNT = 0.8  # the reward of a right answer at turn t: DISCOUNT ** (t - 1)


def guess(reply: Reply, answer: str, prompt: Any, turn: int, turns_left: int) -> End | str:
    """The next message after `reply`, or the end (module docstring)."""
    if is_correct(reply.text, answer):
        return End(DISCOUNT ** (turn - 1))
    if turns_left == 0:
        return End(0.0)
    return f"{hint(reply.text, answer)} {_text(prompt)}"


def hint(text: str, answer: str) -> str:
    """`-` (too high), `+` (too low) or `*` (not an integer) for an answer `text`."""
    try:
        value, target = int(text.strip()), int(answer.strip())
    except ValueError:
        return "*"
    return "-" if value > target else "+"


def _text(prompt: Any) -> str:
    """The problem's text: the prompt itself, or the content of its last chat message."""
    if isinstance(prompt, str):
        return prompt
    return str(prompt[-1]["content"]) if prompt else ""
