"""The producers' prompt format and rewards, lent to an evaluation that scores completions as
training does (consumer/evaluation/heldout.py's `Judge`: `asyncgrpo launch`'s start and final
scores, a sweep's snapshots, `asyncgrpo eval`).

`HeldOutJudge(cfg, model_dir, vocab_size)`: prompts encoded by the producers' `PromptCodec`
(`task.prompt_format`; chat messages through the chat template), completions decoded as reward
functions see them, and `rewards(texts, rows)`: each completion scored against its row by a
`RewardRunner` of `rewards.fns` (their weights, time limits and worker processes), one call per
completion, all in flight at once; the runner's workers stop when it returns. A row is anything
with a lease's fields (`prompt`, `answer`, `messages`, `columns`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from common import wire
from common.config import Config
from producer.tokenizer import PromptCodec


class Row(Protocol):
    """What a lease carries of one row (`wire.Lease`'s fields of the same names)."""

    @property
    def prompt(self) -> str: ...
    @property
    def answer(self) -> str: ...
    @property
    def messages(self) -> tuple[wire.ChatTurn, ...]: ...
    @property
    def columns(self) -> str: ...


class HeldOutJudge:
    def __init__(self, cfg: Config, model_dir: Path, vocab_size: int) -> None:
        self.cfg = cfg
        self.codec = PromptCodec(model_dir, cfg.task.prompt_format, vocab_size=vocab_size)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return self.codec.stop_ids

    def encode(self, row: Row) -> list[int]:
        return self.codec.encode(row.messages or row.prompt)

    def decode(self, ids: Any) -> str:
        return self.codec.decode(ids)

    async def rewards(self, texts: Sequence[str], rows: Sequence[Row]) -> list[float]:
        from producer.rewards.runner import RewardRunner

        rewards = self.cfg.rewards
        runner = RewardRunner(rewards.fns, timeout_s=rewards.timeout_s, workers=rewards.workers)
        async with runner:
            scored = await asyncio.gather(
                *(
                    runner.score([t], r.answer, prompt=_prompt_of(r), columns=r.columns)
                    for t, r in zip(texts, rows, strict=True)
                )
            )
        return [float(s.rewards[0]) for s in scored]


def _prompt_of(row: Row) -> str | list[dict[str, str]]:
    """The prompt as rewards receive it (text, or the chat messages as dicts)."""
    return [{"role": t.role, "content": t.content} for t in row.messages] or row.prompt
