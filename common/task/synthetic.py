"""The built-in synthetic verifiable task: fixed-width addition, checked by a program.

Owns the problems, the train / held-out split and the correctness rule; pure and deterministic
(no torch, no I/O). Rewards (producer/rewards/builtins.py) and evaluation
(consumer/evaluation/greedy.py) both judge with `is_correct`; the demo model's warm-up
(launch/demo_model.py) draws from the train split.

Problems: `a+b=` with 0 <= a, b < 10**digits. Operands are zero-padded to `digits` characters and
the answer, the sum, to `digits + 1`, so every digit has a fixed position
(digits = 2: `"07+45="` → `"052"`, `"49+97="` → `"146"`). Prompts are plain text (no chat
template); a model ends its answer with its EOS token.

Split: every (a, b) pair belongs to exactly one split, decided by a keyed hash of
(split_seed, digits, a, b): about 1 in `heldout_every` pairs is held out, the rest are for
training. The split is a fixed property of the task, like a dataset's test set: `split_seed`
defaults to 0 and the run seed (`seed`) never changes it, so no held-out problem ever appears in
training, whatever seed a run or the demo model's warm-up uses.
- `example(index, "heldout")`: the index-th held-out problem, 0 <= index < heldout_size, in a
  shuffled order fixed by `split_seed`, so any prefix (`make_examples("heldout", n)`) is a
  uniform sample and the same one for every run.
- `example(index, "train")`: any index >= 0 (the train split is a stream): a hash of
  (seed, index) picks one of the `train_size` training pairs, uniformly and reproducibly.

Correctness (`is_correct`): the completion and the answer, each with leading and trailing
whitespace removed, are equal character for character. For answer "052": "052" and "  052 "
are right; "52", "0520", "05 2" and "052." are wrong. Nothing else is normalised (no number
parsing), so the rule is cheap and unambiguous.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

Split = Literal["train", "heldout"]
SPLITS: tuple[Split, ...] = ("train", "heldout")


@dataclass(frozen=True, slots=True)
class Example:
    prompt: str
    answer: str


def is_correct(completion_text: str, answer: str) -> bool:
    """Exact match after stripping whitespace from both ends of completion and answer."""
    return completion_text.strip() == answer.strip()


def _hash(*parts: object) -> int:
    key = ":".join(map(str, parts)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


class ArithmeticTask:
    """Addition of two `digits`-digit numbers, split by a seeded hash (see module docstring)."""

    def __init__(
        self, *, seed: int = 0, digits: int = 2, heldout_every: int = 10, split_seed: int = 0
    ) -> None:
        if not 1 <= digits <= 3:  # both splits are materialised: 10**(2 * digits) pairs
            raise ValueError(f"digits must be in 1..3, got {digits}")
        if heldout_every < 2:
            raise ValueError(f"heldout_every must be >= 2, got {heldout_every}")
        self.seed, self.digits, self.heldout_every = seed, digits, heldout_every
        self.split_seed = split_seed

    @cached_property
    def _pairs(self) -> dict[Split, list[tuple[int, int]]]:
        """Both splits, computed on first use (10**(2 * digits) hashes)."""
        limit = 10**self.digits
        train: list[tuple[int, int]] = []
        heldout: list[tuple[int, int]] = []
        for a in range(limit):
            for b in range(limit):
                (heldout if self.is_heldout(a, b) else train).append((a, b))
        random.Random(f"{self.split_seed}:{self.digits}:heldout-order").shuffle(heldout)
        return {"train": train, "heldout": heldout}

    def is_heldout(self, a: int, b: int) -> bool:
        return _hash("split", self.split_seed, self.digits, a, b) % self.heldout_every == 0

    @property
    def heldout_size(self) -> int:
        return len(self._pairs["heldout"])

    @property
    def train_size(self) -> int:
        return len(self._pairs["train"])

    def pairs(self, split: Split) -> Sequence[tuple[int, int]]:
        """All operand pairs of a split (held-out: in `example` order; train: sorted)."""
        _check_split(split)
        return tuple(self._pairs[split])

    def format(self, a: int, b: int) -> Example:
        d = self.digits
        return Example(f"{a:0{d}d}+{b:0{d}d}=", f"{a + b:0{d + 1}d}")

    def example(self, index: int, split: Split) -> Example:
        _check_split(split)
        if index < 0:
            raise IndexError(f"example index must be >= 0, got {index}")
        if split == "heldout":
            a, b = self._pairs["heldout"][index]
        else:
            train = self._pairs["train"]
            a, b = train[_hash("train", self.seed, index) % len(train)]
        return self.format(a, b)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")


def make_examples(
    split: Split, n: int | None = None, *, seed: int = 0, start: int = 0
) -> list[Example]:
    """`n` examples of the default task from index `start` (held-out: at most all of them)."""
    task = ArithmeticTask(seed=seed)
    if split == "heldout":
        stop = task.heldout_size if n is None else min(start + n, task.heldout_size)
    else:
        if n is None:
            raise ValueError("the train split is a stream: pass n")
        stop = start + n
    return [task.example(i, split) for i in range(start, stop)]
