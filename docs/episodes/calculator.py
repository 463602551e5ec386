"""The episodes example (docs/episodes.md): SmolLM2-135M-Instruct multiplies two 3-digit numbers
with a calculator it calls, in a multi-turn episode.

Owns the rows (`python docs/episodes/calculator.py` writes train.jsonl and heldout.jsonl beside
it; a test checks that the files in the repository are what it writes), the calculator (a plain
Python function, `multiply`) and the environment that dispatches it (`calculator`, named
"calculator:calculator" in calculator.toml).

A row: a system message describing the calculator and a user message with the product to
compute (`messages`, rendered with the model's chat template), and the product (`answer`).
After each model turn the environment (`calculator`):
- ends the episode with reward 1 when the reply's last number is the product (with or without
  the calculator's help; commas ignored);
- otherwise, when the reply writes a multiplication `a * b` and turns are left, calls the
  calculator on its first one and answers with a `tool` message, `a * b = result`;
- otherwise ends it with reward 0.
The call syntax is the plain one the system message describes, not a JSON tool call: SmolLM2's
chat template has no tool format, and the model wrote none of 32 JSON calls (the plain
`<tool_call>` format of producer/episodes/tools.py, described in its system message) in a
probe, so GRPO would have had nothing to reinforce; it writes a multiplication in about half of
its first turns.

Split: pairs (a, b) of 100..999 drawn with a fixed seed; 256 for training, 64 held out, none in
both.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

from producer.episodes import End, Reply

SYSTEM = (
    "You have a calculator. To use it, write the multiplication, like 123 * 456, and the "
    "calculator replies with its result. Then answer with the number only."
)
QUESTION = "What is {a} * {b}?"
EXPRESSION = re.compile(r"(\d{1,6})\s*[*×x]\s*(\d{1,6})")
NUMBER = re.compile(r"\d+")
TRAIN, HELDOUT = 256, 64


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def calculator(reply: Reply, answer: str, turns_left: int) -> End | dict[str, str]:
    """The environment (module docstring)."""
    text = reply.text.replace(",", "")
    numbers = NUMBER.findall(text)
    if numbers and numbers[-1] == answer:
        return End(1.0)
    call = EXPRESSION.search(text)
    if call is None or turns_left == 0:
        return End(0.0)
    a, b = int(call.group(1)), int(call.group(2))
    return {"role": "tool", "content": f"{a} * {b} = {multiply(a, b)}"}


def rows(seed: int = 0) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """(train rows, held-out rows): distinct pairs of 3-digit numbers."""
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    while len(pairs) < TRAIN + HELDOUT:
        pair = (rng.randint(100, 999), rng.randint(100, 999))
        if pair not in seen and pair[::-1] not in seen:
            seen.add(pair)
            pairs.append(pair)
    out = [
        {
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": QUESTION.format(a=a, b=b)},
            ],
            "answer": str(a * b),
        }
        for a, b in pairs
    ]
    return out[:TRAIN], out[TRAIN:]


def main() -> None:
    here = Path(__file__).parent
    train, heldout = rows()
    for name, part in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        text = "".join(json.dumps(r) + "\n" for r in part)
        (here / name).write_text(text)
        print(f"wrote {here / name}: {len(part)} rows", file=sys.stderr)


if __name__ == "__main__":
    main()
