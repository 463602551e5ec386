"""The producers' prompt format and rewards, lent to an evaluation that scores completions as
training does (consumer/evaluation/heldout.py's `Judge`: `asyncgrpo launch`'s start and final
scores, a sweep's snapshots, `asyncgrpo eval`).

`HeldOutJudge(cfg, model_dir, vocab_size)`: prompts encoded by the producers' `PromptCodec`
(`task.prompt_format`; chat messages through the chat template), completions decoded as reward
functions see them, and `rewards(texts, rows)`: each completion scored against its row by a
`RewardRunner` of `rewards.fns` (their weights, time limits and worker processes), one call per
completion, all in flight at once; the runner's workers stop when it returns. `group_scores`
scores whole groups (completions of one row, as a producer scores a lease) and keeps what a
dry run shows: each function's own scores, the failed calls and the first of them
(`GroupScores`). A row is anything with a lease's fields (`prompt`, `answer`, `messages`,
`columns`). A run with episodes
(`[episodes]`): `episode_rewards(model_dir, snapshot, rows)`, each row's episode played and
scored as in training (producer/episodes/heldout.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import Config
from producer.rewards.row import Row
from producer.tokenizer import PromptCodec


@dataclass(frozen=True, slots=True)
class GroupScores:
    """One group scored: the weighted rewards, each function's own scores (by reward name,
    common/config/run.py `reward_names`), the failed calls (scored 0) and the first of them."""

    rewards: list[float]
    parts: dict[str, list[float]]
    num_failed: int
    first_error: str


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

    async def group_scores(self, groups: Sequence[tuple[Sequence[str], Row]]) -> list[GroupScores]:
        from producer.rewards.runner import RewardRunner

        rewards = self.cfg.rewards
        runner = RewardRunner(rewards.fns, timeout_s=rewards.timeout_s, workers=rewards.workers)
        async with runner:
            scored = await asyncio.gather(
                *(
                    runner.score(list(texts), r.answer, prompt=_prompt_of(r), columns=r.columns)
                    for texts, r in groups
                )
            )
        return [
            GroupScores(
                rewards=[float(v) for v in s.rewards],
                parts={name: [float(v) for v in part] for name, part in s.parts.items()},
                num_failed=s.num_errors + s.num_timeouts,
                first_error=s.first_error,
            )
            for s in scored
        ]

    async def episode_rewards(
        self, model_dir: Path, snapshot: Path | None, rows: Sequence[Row]
    ) -> list[float]:
        from producer.episodes.heldout import heldout_rewards

        return await heldout_rewards(self.cfg, model_dir, snapshot, rows)


def _prompt_of(row: Row) -> str | list[dict[str, str]]:
    """The prompt as rewards receive it (text, or the chat messages as dicts)."""
    return [{"role": t.role, "content": t.content} for t in row.messages] or row.prompt
