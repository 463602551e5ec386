"""A model or snapshot scored on the run's held-out rows as training scores it.

- `eval.path` set: its rows, read like task.path (consumer/data/sources.py), each prompt
  formatted as producers format it (text per `task.prompt_format`, chat messages with the chat
  template), one completion per prompt, greedy or sampled at `sampling.temperature` over the
  full vocabulary (`eval.mode`, seeded by `run.seed`), at most `sampling.max_new_tokens` tokens,
  cut at the first stop token, and scored by `rewards.fns` with their weights through the
  producers' own reward runner (time limits and worker isolation included), each reward given
  the row as in training (prompt, answer, the other columns). The score is the mean reward per
  prompt: the accuracy, for a 0/1 reward.
- a run with episodes (`[episodes]`): the success of one episode per held-out row (`eval.path`,
  else the synthetic task's whole held-out split), played with the run's environment as
  training plays it, greedy or sampled (`eval.mode`), and scored as training scores it
  (producer/episodes/heldout.py, lent by the judge): the share of episodes whose reward is
  above 0 (`episode_success`: for the built-in `guess`, solved within `episodes.max_turns`);
- otherwise, for the synthetic task: greedy accuracy on its whole held-out split
  (consumer/evaluation/greedy.py);
- otherwise (a task of your own without `eval.path`): nothing.

The prompt format and the rewards are the producers' (the consumer runs no reward code of its
own): the caller lends them as a `Judge`, built by a `JudgeFactory` from the config, the model
directory and the model's vocabulary size (`asyncgrpo launch`, `stress` and `eval` pass
producer/rewards/judge.py's `HeldOutJudge`).

Runs in the calling process, on the first visible CUDA GPU if there is one, else the CPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from common.config import Config
from consumer.data.rows import PromptRow


@dataclass(frozen=True, slots=True)
class HeldOutScore:
    score: float  # mean reward per prompt (accuracy for a 0/1 reward)
    size: int  # prompts scored


class Judge(Protocol):
    """The producers' prompt format and rewards, lent to an evaluation."""

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Token ids that end a completion."""
        ...

    def encode(self, row: PromptRow) -> list[int]:
        """The prompt's token ids, as a producer's engine sees them."""
        ...

    def decode(self, ids: Any) -> str:
        """A completion's text, as reward functions see it."""
        ...

    async def rewards(self, texts: Sequence[str], rows: Sequence[PromptRow]) -> list[float]:
        """Each completion's reward (the weighted sum of `rewards.fns`) against its row."""
        ...

    async def group_scores(self, groups: Sequence[tuple[Sequence[str], PromptRow]]) -> list[Any]:
        """Each group (completions of one row) scored as a producer scores it: a `GroupScores`
        (producer/rewards/judge.py) per group, its rewards, each function's own scores, its
        failed calls and the first of them."""
        ...

    async def episode_rewards(
        self, model_dir: Path, snapshot: Path | None, rows: Sequence[PromptRow]
    ) -> list[float]:
        """Each row's episode reward, played and scored as training does (a run with
        episodes)."""
        ...


JudgeFactory = Callable[[Config, Path, int], Judge]  # (config, model directory, vocabulary size)


def mean_reward(
    cfg: Config,
    model_dir: Path,
    snapshot: Path | None,
    *,
    judge: JudgeFactory,
    progress: Callable[[int], Callable[[int], None]] | None = None,
) -> HeldOutScore:
    """The mean reward of `model_dir` (with `snapshot`'s weights over it, if given) on the rows
    of `eval.path` (a `ConfigError` naming the file, row and field if one is malformed);
    `progress(total)`: told the rows completed after each batch."""
    import torch

    from consumer.data.sources import heldout_rows
    from consumer.evaluation.greedy import load_model

    rows = heldout_rows(cfg)
    model, _ = load_model(model_dir, snapshot)
    if torch.cuda.is_available():
        model = model.to("cuda")
    lent = judge(cfg, model_dir, model.config.vocab_size)
    torch.manual_seed(cfg.run.seed)
    told = progress(len(rows)) if progress is not None else None
    texts = []
    for start in range(0, len(rows), 32):
        prompts = [lent.encode(r) for r in rows[start : start + 32]]
        texts += [lent.decode(ids) for ids in complete(model, prompts, lent.stop_ids, cfg)]
        if told is not None:
            told(len(texts))
    rewards = asyncio.run(lent.rewards(texts, rows))
    return HeldOutScore(sum(rewards) / len(rewards), len(rewards))


def complete(
    model: Any,
    prompts: list[list[int]],
    stop_ids: tuple[int, ...],
    cfg: Config,
    *,
    sampled: bool | None = None,
) -> Any:
    """Completion token ids (numpy, cut before the first stop token) of left-padded prompts:
    sampled at `sampling.temperature` over the full vocabulary, or greedy (`sampled`; default:
    `eval.mode`)."""
    import torch

    pad = stop_ids[0] if stop_ids else 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    device = next(model.parameters()).device
    sampled = cfg.eval.mode == "sampled" if sampled is None else sampled
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=cfg.sampling.max_new_tokens,
            do_sample=sampled,
            temperature=cfg.sampling.temperature if sampled else None,
            top_k=0 if sampled else None,
            top_p=1.0 if sampled else None,
            pad_token_id=pad,
            eos_token_id=list(stop_ids) or None,
        )
    rows = []
    for row in out[:, width:].cpu().numpy():
        stops = [i for i, t in enumerate(row) if int(t) in stop_ids]
        rows.append(row[: stops[0]] if stops else row)
    return rows


def episode_success(
    cfg: Config, model_dir: Path, snapshot: Path | None, *, judge: JudgeFactory
) -> HeldOutScore:
    """The share of held-out episodes that end with a reward above 0 (module docstring)."""
    from transformers import AutoConfig

    from consumer.data.sources import heldout_rows

    if cfg.eval.path:
        rows = heldout_rows(cfg)
    else:
        from common.task.synthetic import make_examples

        rows = [PromptRow(ex.prompt, ex.answer) for ex in make_examples("heldout", seed=0)]
    vocab = int(AutoConfig.from_pretrained(model_dir).vocab_size)
    rewards = asyncio.run(judge(cfg, model_dir, vocab).episode_rewards(model_dir, snapshot, rows))
    return HeldOutScore(sum(r > 0 for r in rewards) / len(rewards), len(rewards))
