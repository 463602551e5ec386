"""Scoring one lease's group: the `Rewards` protocol the worker calls, and its two kinds.

- `TaskRewards`: decodes the G completions (special tokens dropped, producer/tokenizer.py) and
  scores them against the lease's row (its prompt, text or chat messages, its reference answer
  and its other columns) with the run's reward functions
  (`RewardRunner`, producer/rewards/runner.py: a raising or hanging reward scores 0 and is counted).
  Its `counters` sum, over the groups scored, the reward calls that failed (`reward_errors`) and
  timed out (`reward_timeouts`), and the completions whose program the sandbox stopped, by
  reason (`sandbox_timeout`, `sandbox_memory`, ...: producer/sandbox/code_reward.py); a key
  appears with the first group that has one. `score_episodes` scores episodes
  (producer/episodes/) that their environment left to the reward functions: each one's last
  assistant message as `completion`, the conversation before it as `prompt`, one call per
  episode.
- `FakeRewards`: the fake engine's rewards, a seeded coin per completion (no text is read: fake
  tokens decode to nothing). It counts nothing.

`make_rewards` picks the one the config's engine goes with. The worker never asks which it has.
producer/rewards/runner.py is imported only for `TaskRewards`, so fake-engine producers start
without it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from common import wire
from common.config import Config, RewardSpec
from producer.engines.base import Completion
from producer.tokenizer import PromptCodec

if TYPE_CHECKING:
    from producer.rewards.runner import RewardRunner


Conversation = list[dict[str, str]]  # {"role", "content"} messages


@dataclass(frozen=True, slots=True, eq=False)
class GroupScore:
    rewards: np.ndarray  # float32 [G]
    num_failed: int  # reward calls that raised, returned no finite number or timed out (scored 0)
    # float32 [F, G]: each reward function's own score, in the order of `RunSpec.reward_fns`
    # ([0, G] when there are no functions: the fake engine's coins)
    parts: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    first_error: str = ""  # the first failed call, in one line (`wire.Group.reward_error`)


class Rewards(Protocol):
    """What the worker needs to score the groups of one session."""

    @property
    def counters(self) -> dict[str, float]:
        """Cumulative counters, reported in the producer's heartbeats."""
        ...

    async def score_group(self, lease: wire.Lease, completions: Sequence[Completion]) -> GroupScore:
        """Rewards of the G completions of `lease`, and how many reward calls failed."""
        ...

    async def score_episodes(
        self, lease: wire.Lease, finals: Sequence[str], conversations: Sequence[Conversation]
    ) -> GroupScore:
        """Rewards of episodes of `lease` whose environment left them to the reward functions:
        each one's last assistant message (`finals`) scored as `completion`, with the
        conversation before it as `prompt` (producer/episodes/loop.py)."""
        ...

    def close(self) -> None:
        """Stop any worker processes; no `score_group` afterwards."""
        ...


class TaskRewards:
    """The run's reward functions on the decoded completions."""

    def __init__(self, runner: RewardRunner, codec: PromptCodec) -> None:
        self.runner, self.codec = runner, codec
        self.counters: dict[str, float] = {}

    async def score_group(self, lease: wire.Lease, completions: Sequence[Completion]) -> GroupScore:
        texts = [self.codec.decode(c.token_ids) for c in completions]
        prompt = [{"role": t.role, "content": t.content} for t in lease.messages] or lease.prompt
        scored = await self.runner.score(texts, lease.answer, prompt=prompt, columns=lease.columns)
        self._count("reward_errors", scored.num_errors)
        self._count("reward_timeouts", scored.num_timeouts)
        for reason, n in scored.contained.items():
            self._count(f"sandbox_{reason}", n)
        parts = np.stack(list(scored.parts.values())) if scored.parts else None
        failed = scored.num_errors + scored.num_timeouts
        if parts is None:
            return GroupScore(scored.rewards, failed, first_error=scored.first_error)
        parts = parts.astype(np.float32, copy=False)
        return GroupScore(scored.rewards, failed, parts, first_error=scored.first_error)

    async def score_episodes(
        self, lease: wire.Lease, finals: Sequence[str], conversations: Sequence[Conversation]
    ) -> GroupScore:
        if not finals:
            return GroupScore(np.zeros(0, np.float32), 0, np.zeros((len(self.runner.specs), 0)))
        scored = await asyncio.gather(
            *(
                self.runner.score([text], lease.answer, prompt=conv, columns=lease.columns)
                for text, conv in zip(finals, conversations, strict=True)
            )
        )
        errors = sum(s.num_errors for s in scored)
        timeouts = sum(s.num_timeouts for s in scored)
        self._count("reward_errors", errors)
        self._count("reward_timeouts", timeouts)
        for s in scored:
            for reason, n in s.contained.items():
                self._count(f"sandbox_{reason}", n)
        rewards = np.concatenate([s.rewards for s in scored]).astype(np.float32)
        parts = np.array([[s.parts[n][0] for s in scored] for n in self.runner.names], np.float32)
        return GroupScore(rewards, errors + timeouts, parts)

    def _count(self, key: str, n: float) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def close(self) -> None:
        self.runner.close()


class FakeRewards:
    """The fake engine's rewards: a seeded coin per completion, 1 with probability `p`.

    Drawn from (run seed, lease id), so a lease scores the same whichever producer runs it.
    The completions' contents are never read (fake tokens decode to nothing).
    """

    def __init__(self, *, run_seed: int, p: float) -> None:
        self.run_seed, self.p = run_seed, p
        self.counters: dict[str, float] = {}

    def score(self, lease_id: int, n: int) -> np.ndarray:
        """float32 [n] rewards in {0, 1} of lease `lease_id`'s n completions."""
        rng = np.random.default_rng([self.run_seed, lease_id])
        return (rng.random(n) < self.p).astype(np.float32)

    async def score_group(self, lease: wire.Lease, completions: Sequence[Completion]) -> GroupScore:
        return GroupScore(self.score(lease.lease_id, len(completions)), 0)

    async def score_episodes(
        self, lease: wire.Lease, finals: Sequence[str], conversations: Sequence[Conversation]
    ) -> GroupScore:
        return GroupScore(self.score(lease.lease_id, len(finals)), 0)

    def close(self) -> None:
        return None


def make_rewards(cfg: Config, spec: wire.RunSpec, codec: PromptCodec) -> Rewards:
    """The fake engine's coins, or the consumer's reward functions (`spec.reward_fns`) run
    with this producer's `rewards.workers`."""
    if cfg.producer.engine == "fake":
        return FakeRewards(run_seed=cfg.run.seed, p=cfg.fake.reward_p)
    from producer.rewards.runner import RewardRunner

    specs = [RewardSpec(r.fn, r.weight) for r in spec.reward_fns]
    runner = RewardRunner(specs, timeout_s=spec.reward_timeout_s, workers=cfg.rewards.workers)
    return TaskRewards(runner, codec)
