"""A dry run: a run's first prompts sampled with its starting model and scored by its rewards,
as the producers will score them, before any training (`asyncgrpo launch --dry-run`).

`sample_and_score(cfg, model_dir, judge=..., num_prompts=...)` takes the first `num_prompts`
prompts of the task (its rows in file order, or the synthetic train split), encodes each as a
producer does (the lent `Judge`: `task.prompt_format`, the chat template), samples it
G = `sampling.group_size` times at `sampling.temperature` over the full vocabulary (a dry run
leaves top-p, top-k and min-p out) with at most `sampling.max_new_tokens` tokens, cut at the
first stop token, decodes the completions as reward functions see them and scores each group
through the producers' reward runner (time limits, worker processes): every completion's
reward and each function's own score, the failed calls and the first of them, and how many of
the prompt's tokens the model's tokenizer does not know. Runs in the calling process, on the
first visible GPU if there is one, else the CPU; seeded by `run.seed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import Config
from consumer.data.prompts import make_source
from consumer.data.rows import PromptRow
from consumer.evaluation.heldout import JudgeFactory, complete


@dataclass(frozen=True, slots=True)
class DryGroup:
    """One prompt's G sampled completions and how the run's rewards scored them."""

    prompt: str  # the row's text (chat messages: their contents)
    answer: str
    completions: list[str]
    rewards: list[float]
    parts: dict[str, list[float]]  # each reward function's own scores
    num_failed: int  # reward calls that failed or timed out (scored 0)
    first_error: str  # the first of them, in one line
    unknown_tokens: int  # prompt tokens the tokenizer maps to its unknown token

    @property
    def signal(self) -> bool:
        """Whether the group's rewards differ (a learning signal)."""
        return len(set(self.rewards)) > 1


def sample_and_score(
    cfg: Config, model_dir: Path, *, judge: JudgeFactory, num_prompts: int
) -> list[DryGroup]:
    """See the module docstring."""
    import torch

    from consumer.evaluation.greedy import load_model
    from consumer.no_signal import unknown_token

    source = make_source(cfg.task, seed=cfg.run.seed)
    rows = [source.get(i) for i in range(min(num_prompts, len(source)))]
    model, _ = load_model(model_dir)
    if torch.cuda.is_available():
        model = model.to("cuda")
    lent = judge(cfg, model_dir, model.config.vocab_size)
    unknown_id, _ = unknown_token(model_dir)
    torch.manual_seed(cfg.run.seed)
    G = cfg.sampling.group_size
    encoded = [lent.encode(r) for r in rows]
    prompts = [ids for ids in encoded for _ in range(G)]
    texts = [lent.decode(ids) for ids in complete(model, prompts, lent.stop_ids, cfg, sampled=True)]
    groups = [(texts[i * G : (i + 1) * G], row) for i, row in enumerate(rows)]
    scored = asyncio.run(lent.group_scores(groups))
    return [
        _dry_group(row, ids, completions, s, unknown_id)
        for (completions, row), ids, s in zip(groups, encoded, scored, strict=True)
    ]


def _dry_group(
    row: PromptRow, ids: list[int], completions: Sequence[str], scores: Any, unknown_id: int | None
) -> DryGroup:
    return DryGroup(
        prompt=row.prompt or " ".join(t.content for t in row.messages),
        answer=row.answer,
        completions=list(completions),
        rewards=scores.rewards,
        parts=scores.parts,
        num_failed=scores.num_failed,
        first_error=scores.first_error,
        unknown_tokens=ids.count(unknown_id) if unknown_id is not None else 0,
    )
