"""Held-out episodes: a model (a snapshot over it) plays the run's environment on held-out rows,
as training does, one episode per row (lent to consumer/evaluation/heldout.py through the judge,
producer/rewards/judge.py).

`heldout_rewards(cfg, model_dir, snapshot, rows)`: the hf engine on the first CUDA GPU if any,
else the CPU, with the snapshot's weights loaded in place; each row's episode sampled by the
episode loop (producer/episodes/loop.py) greedily (`eval.mode = "greedy"`, the default) or at
`sampling.temperature` (seeded by `run.seed` and the row), at most `sampling.max_new_tokens`
tokens a turn, with the run's `[episodes]` settings (the environment in its workers, its limits;
no simulated latency: it measures the model, not a clock); scored as training scores it (the
environment's reward, else `rewards.fns`; an episode the environment failed scores 0). All rows
are in flight at once (the engine batches their turns). Returns each row's reward.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from common import wire
from common.config import Config, RewardSpec
from producer.engines.base import SamplingParams
from producer.episodes.loop import run_episodes, score_episodes
from producer.episodes.render import TurnRenderer
from producer.episodes.runner import EnvRunner
from producer.rewards.row import Row
from producer.tokenizer import PromptCodec


async def heldout_rewards(
    cfg: Config, model_dir: Path, snapshot: Path | None, rows: Sequence[Row]
) -> list[float]:
    """Each row's episode reward (module docstring)."""
    import torch

    from producer.engines.hf import HFEngine
    from producer.rewards.runner import RewardRunner
    from producer.rewards.scoring import TaskRewards

    spec = cfg.episodes.spec()
    assert spec is not None, "a run with episodes"
    spec = dataclasses.replace(spec, latency_s=0.0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    engine = HFEngine(model_dir, device=device, seed=cfg.run.seed)
    if snapshot is not None:
        path = Path(snapshot)  # a snapshot directory, or its model.safetensors
        directory = path.parent if path.name.endswith(".safetensors") else path
        await engine.load_weights(directory, 0)
    codec = PromptCodec(model_dir, cfg.task.prompt_format, vocab_size=engine.vocab_size)
    runner = EnvRunner(spec, workers=cfg.episodes.workers)
    fns = [RewardSpec(r.fn, r.weight) for r in cfg.rewards.fns]
    rewards = TaskRewards(
        RewardRunner(fns, timeout_s=cfg.rewards.timeout_s, workers=cfg.rewards.workers), codec
    )
    renderer = TurnRenderer(codec, tools=runner.tools)
    greedy = cfg.eval.mode == "greedy"

    async def one(index: int, row: Row) -> float:
        lease = wire.Lease(
            lease_id=index,
            prompt_index=index,
            step=0,
            min_version=0,
            prompt=row.prompt,
            answer=row.answer,
            messages=row.messages,
            columns=row.columns,
        )
        params = SamplingParams(
            n=1,
            temperature=0.0 if greedy else cfg.sampling.temperature,
            max_new_tokens=cfg.sampling.max_new_tokens,
            seed=cfg.run.seed * 1_000_003 + index,
            stop_token_ids=codec.stop_ids,
        )
        _, episodes = await run_episodes(
            engine, renderer, runner, lease=lease, spec=spec, params=params, count=_ignore
        )
        return float((await score_episodes(rewards, lease, episodes)).rewards[0])

    try:
        return list(await asyncio.gather(*(one(i, row) for i, row in enumerate(rows))))
    finally:
        runner.close()
        rewards.close()
        await engine.close()


def _ignore(key: str, value: float) -> None:
    """Held-out episodes count nothing."""
