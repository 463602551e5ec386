"""Prompt sources and the prompt order the consumer leases from.

The consumer owns the prompt cursor (DESIGN.md): leases carry the prompt (text or chat
messages), the reference answer and the row's other columns (consumer/data/rows.py), so
producers need no copy of the dataset and hold no state worth losing.

- `RowSource`: the user's rows (`task.source` = jsonl, parquet or hf), read and checked whole
  at start by consumer/data/sources.py: a bad row stops the consumer with its file, row
  and field.
- `SyntheticSource`: the built-in verifiable task of `common.task.synthetic` (train split), indexed
  deterministically; its length is virtual (indices are generated on demand).
- `PromptOrder`: epochs over a source, shuffled per epoch with a seeded permutation, plus a retry
  queue that is served first (prompts whose lease expired or whose group was dropped as stale).
  Its state (`state_dict`) is part of a checkpoint, so a resumed run leases the same prompts next.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

import numpy as np

from common.config import TaskConfig
from consumer.data.rows import PromptRow
from consumer.data.sources import load_rows

SYNTHETIC_TRAIN_SIZE = 1_000_000


class PromptSource(Protocol):
    def __len__(self) -> int: ...

    def get(self, index: int) -> PromptRow:
        """Prompt `index`: its text or chat messages, its answer and its other columns."""
        ...

    @property
    def max_row_bytes(self) -> int:
        """The largest row's size as a lease carries it (bounds the rows of one grant)."""
        ...

    @property
    def has_chat(self) -> bool:
        """Whether some prompt is a list of chat messages (the model needs a chat template)."""
        ...


class RowSource:
    """Rows read and checked at start (consumer/data/sources.py), served from memory."""

    def __init__(self, rows: list[PromptRow]) -> None:
        assert rows, "load_rows refuses data without rows"
        self._rows = rows
        self.max_row_bytes = max(r.num_bytes for r in rows)
        self.has_chat = any(r.messages for r in rows)

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, index: int) -> PromptRow:
        return self._rows[index]


class SyntheticSource:
    max_row_bytes = 64  # "07+45=" and "052"
    has_chat = False

    def __init__(self, *, seed: int) -> None:
        from common.task.synthetic import ArithmeticTask

        self._task = ArithmeticTask(seed=seed)
        # its splits (10,000 hashes, ~80 ms) are built here, on the caller's thread, not in
        # the network thread's first grant
        self._task.pairs("train")

    def __len__(self) -> int:
        return SYNTHETIC_TRAIN_SIZE

    def get(self, index: int) -> PromptRow:
        ex = self._task.example(index, "train")
        return PromptRow(ex.prompt, ex.answer)


def make_source(cfg: TaskConfig, *, seed: int) -> PromptSource:
    """The synthetic task, or the rows of `task.path` (`ConfigError` naming a bad row)."""
    if cfg.source == "synthetic":
        return SyntheticSource(seed=seed)
    return RowSource(load_rows(cfg))


class PromptOrder:
    """Which prompt index to lease next: retries first, then epochs in seeded order."""

    def __init__(self, num_prompts: int, *, seed: int, shuffle: bool, epochs: int) -> None:
        assert num_prompts > 0
        self.num_prompts, self.seed, self.shuffle, self.epochs = num_prompts, seed, shuffle, epochs
        self.epoch, self.position = 0, 0
        self.retry: deque[int] = deque()
        self._perm: np.ndarray | None = None

    def _index(self, position: int) -> int:
        if not self.shuffle or self.num_prompts >= SYNTHETIC_TRAIN_SIZE:
            return position
        if self._perm is None:
            rng = np.random.default_rng([self.seed, self.epoch])
            self._perm = rng.permutation(self.num_prompts)
        return int(self._perm[position])

    def exhausted(self) -> bool:
        return not self.retry and self.epochs > 0 and self.epoch >= self.epochs

    def next(self) -> int | None:
        """The next prompt index, or None when every epoch is done and nothing waits for retry."""
        if self.retry:
            return self.retry.popleft()
        if self.exhausted():
            return None
        index = self._index(self.position)
        self.position += 1
        if self.position == self.num_prompts:
            self.epoch, self.position, self._perm = self.epoch + 1, 0, None
        return index

    def requeue(self, index: int) -> None:
        self.retry.append(index)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "retry": list(self.retry)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.retry = deque(int(i) for i in state["retry"])
        self._perm = None
