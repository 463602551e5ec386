"""The built-in synthetic verifiable task: two-number addition, checked by a program.

Problems are `a+b=` and the answer is the sum written least-significant digit first, the order
in which one adds by hand (`"27+15="` → `"24"`, i.e. 42 reversed): a small model can carry as it
writes, so it learns the task in seconds and RL has a real slope to climb. 0 <= a, b < 10**digits. Every (a, b) pair
belongs to exactly one split, decided by a hash of the pair and the seed: about 1 in
`heldout_every` pairs is held out, the rest are for training. So no held-out problem ever appears
in training, and both splits are fixed by (seed, digits) alone.

- `example(index, "train")` draws a training pair deterministically from (seed, index): any
  index is valid (the training split is sampled with replacement, like a stream).
- `example(index, "heldout")` is the index-th held-out pair in a fixed order (`heldout_size`).
- `is_correct(completion, answer)`: the completion, whitespace-stripped, equals the answer
  exactly (for answer "86": "86" and "86 " are right; "860", "68", "8 6" are wrong).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Literal

Split = Literal["train", "heldout"]


@dataclass(frozen=True, slots=True)
class Example:
    prompt: str
    answer: str


def is_correct(completion_text: str, answer: str) -> bool:
    return completion_text.strip() == answer.strip()


class ArithmeticTask:
    def __init__(self, *, seed: int = 0, digits: int = 2, heldout_every: int = 10) -> None:
        if digits < 1 or heldout_every < 2:
            raise ValueError("digits must be >= 1 and heldout_every >= 2")
        self.seed, self.digits, self.heldout_every = seed, digits, heldout_every
        self._limit = 10**digits
        self._heldout = [
            (a, b) for a in range(self._limit) for b in range(self._limit) if self._is_heldout(a, b)
        ]

    def _is_heldout(self, a: int, b: int) -> bool:
        h = hashlib.blake2b(f"{self.seed}:{a}+{b}".encode(), digest_size=4).digest()
        return int.from_bytes(h, "little") % self.heldout_every == 0

    @property
    def heldout_size(self) -> int:
        return len(self._heldout)

    def example(self, index: int, split: Split) -> Example:
        if split == "heldout":
            a, b = self._heldout[index]
        elif split == "train":
            rng = random.Random(f"{self.seed}:train:{index}")
            while True:
                a, b = rng.randrange(self._limit), rng.randrange(self._limit)
                if not self._is_heldout(a, b):
                    break
        else:
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        return Example(f"{a}+{b}=", str(a + b)[::-1])


def make_examples(split: Split, n: int, *, seed: int = 0, start: int = 0) -> list[Example]:
    task = ArithmeticTask(seed=seed)
    if split == "heldout":
        n = min(n, task.heldout_size)
    return [task.example(start + i, split) for i in range(n)]
