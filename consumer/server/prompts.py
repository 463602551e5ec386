"""Prompt sources and the prompt order the consumer leases from.

The consumer owns the prompt cursor (DESIGN.md): leases carry the prompt text and reference
answer, so producers need no copy of the dataset and hold no state worth losing.

- `JsonlSource`: one JSON object per line; `prompt_field` and `answer_field` name the keys.
  Lines that are not objects or lack the fields are refused at load time with the line number.
- `SyntheticSource`: the built-in verifiable task of `common.tasks` (train split), indexed
  deterministically; its length is virtual (indices are generated on demand).
- `PromptOrder`: epochs over a source, shuffled per epoch with a seeded permutation, plus a retry
  queue that is served first (prompts whose lease expired or whose group was dropped as stale).
  Its state (`state_dict`) is part of a checkpoint, so a resumed run leases the same prompts next.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from common.config import TaskConfig
from common.errors import ConfigError

SYNTHETIC_TRAIN_SIZE = 1_000_000


class PromptSource(Protocol):
    def __len__(self) -> int: ...

    def get(self, index: int) -> tuple[str, str]:
        """(prompt text, reference answer) of prompt `index`."""
        ...


class JsonlSource:
    def __init__(self, path: Path, *, prompt_field: str, answer_field: str) -> None:
        self._rows: list[tuple[str, str]] = []
        try:
            # Split on b"\n" only: str.splitlines() would also cut at U+2028, U+0085, ... which
            # JSON allows unescaped inside strings (json.dumps(..., ensure_ascii=False) writes
            # them).
            lines = Path(path).read_bytes().split(b"\n")
        except OSError as exc:
            raise ConfigError(f"task.path = {str(path)!r}: {exc}") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise ConfigError(f"{path}:{number}: not UTF-8 ({exc})") from None
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{number}: not JSON ({exc})") from None
            if not isinstance(row, dict) or prompt_field not in row or answer_field not in row:
                raise ConfigError(
                    f"{path}:{number}: needs the fields {prompt_field!r} and {answer_field!r} "
                    "(task.prompt_field / task.answer_field)"
                )
            self._rows.append((str(row[prompt_field]), str(row[answer_field])))
        if not self._rows:
            raise ConfigError(f"task.path = {str(path)!r} holds no prompts")

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, index: int) -> tuple[str, str]:
        return self._rows[index]


class SyntheticSource:
    def __init__(self, *, seed: int) -> None:
        from common.tasks import ArithmeticTask

        self._task = ArithmeticTask(seed=seed)

    def __len__(self) -> int:
        return SYNTHETIC_TRAIN_SIZE

    def get(self, index: int) -> tuple[str, str]:
        ex = self._task.example(index, "train")
        return ex.prompt, ex.answer


def make_source(cfg: TaskConfig, *, seed: int) -> PromptSource:
    if cfg.source == "jsonl":
        return JsonlSource(
            Path(cfg.path), prompt_field=cfg.prompt_field, answer_field=cfg.answer_field
        )
    return SyntheticSource(seed=seed)


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
