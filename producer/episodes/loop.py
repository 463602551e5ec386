"""The episode loop: G episodes of one lease, model turns and environment turns, token in, token
out. Runs on the producer's event loop, in the lease's task (producer/lease_task.py).

`run_episodes(engine, renderer, runner, lease=..., spec=..., params=...)`:
1. The opening: the prompt's ids (`TurnRenderer.opening`, tools described). The first model turn
   of all G episodes is one `generate` call with n = G from those ids, so an engine that shares
   a prompt's prefill (the hf engine: one prefill, its cache repeated; vLLM: its prefix cache)
   does it once.
2. Then each episode on its own (all G at once, as tasks): the environment sees the model's turn
   (producer/episodes/runner.py); its next messages become the delta ids (`TurnRenderer.delta`)
   appended after the sampled ids, and the engine samples the next turn from exactly the ids so
   far (n = 1, a seed of its own: `turn_seed`). Nothing sampled is decoded and encoded again;
   the text the environment reads is a decoding, the ids the learner trains on are the sampled
   ones. An engine with a prefix cache (vLLM) reuses the episode's prefix; the hf engine prefills
   it again.
3. An episode ends (`Episode.finish_reason`, common/wire FINISH_REASONS) when its environment
   returns `End` ("stop"), after `max_turns` model turns ("max_turns"), when the environment's
   messages do not fit the tokens left of `max_episode_tokens` ("max_tokens", counted as
   `episodes_over_budget` and logged: the messages are not appended), or when an environment
   call fails ("env_error": raised, timed out, returned something else than messages or End).
   A model turn samples at most min(`sampling.max_new_tokens`, the tokens left).

`score_episodes(rewards, lease, episodes)`: each episode's reward. The environment's, when it
ended the episode with one; 0 for an episode its environment failed (never trained: the learner
leaves `env_error` episodes out of the loss and of their group's advantages); otherwise (`End()`
without a reward, `max_turns`, `max_tokens`) the run's reward functions score its last assistant
message, the conversation before it as their `prompt`. Per-function scores travel only when the
functions scored every episode of the group.

Each `Episode` holds its ids after the prompt (sampled and inserted), which of them were sampled,
the log-probs, versions and kept sets of the sampled ones only (per turn, as the engine reported
them: an episode may straddle a weight reload, and each token keeps the version that sampled
it), the environment's reward if it gave one, its turns, the seconds spent in the environment,
and the conversation as text (what the reward functions see when they score it).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from common import wire
from common.sampling import kept_set
from common.sampling.kept_set import KeptSets
from producer.engines.base import Completion, Engine, SamplingParams
from producer.episodes.calls import EnvCall
from producer.episodes.contract import End, Next, Reply
from producer.episodes.render import TurnRenderer
from producer.episodes.runner import EnvRunner
from producer.rewards.scoring import GroupScore, Rewards

Count = Callable[[str, float], None]


@dataclass(frozen=True, slots=True, eq=False)
class Episode:
    token_ids: np.ndarray  # int32 [L]: every token after the prompt
    sampled: np.ndarray  # bool [L]: True where the model sampled it
    logprobs: np.ndarray  # float32 [S]: the sampled tokens' behaviour log-probs
    versions: np.ndarray  # int32 [S]
    kept: KeptSets  # the sampled tokens' kept sets (empty without truncation)
    finish_reason: str
    reward: float | None  # the environment's (End(reward)); None: the reward functions'
    turns: int  # model turns
    env_s: float  # seconds in environment calls (simulated latency included)
    messages: list[dict[str, str]] = field(default_factory=list)  # the conversation, as text

    @property
    def last_text(self) -> str:
        """The last assistant message's text (what a reward function scores)."""
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), "")


def turn_seed(seed: int, episode: int, turn: int, *, stream: int = 0) -> int:
    """The seed of turn `turn` of episode `episode` of a lease seeded `seed`: its sampling
    (stream 0, turns >= 2; the first turn samples all G episodes with the lease's seed) or its
    environment call's simulated latency (stream 1)."""
    state = np.random.SeedSequence([seed, episode, turn, stream]).generate_state(1)[0]
    return int(state) & ((1 << 30) - 1)


async def run_episodes(
    engine: Engine,
    renderer: TurnRenderer,
    runner: EnvRunner,
    *,
    lease: wire.Lease,
    spec: wire.EpisodeSpec,
    params: SamplingParams,
    count: Count,
) -> tuple[list[int], list[Episode]]:
    """(the prompt's ids, `params.n` episodes of `lease`); see the module docstring."""
    prompt = lease.messages or lease.prompt
    prompt_ids, chat = renderer.opening(prompt)
    opening = [{"role": t.role, "content": t.content} for t in lease.messages] or [
        {"role": "user", "content": lease.prompt}
    ]
    first_params = dataclasses.replace(
        params, max_new_tokens=min(params.max_new_tokens, spec.max_episode_tokens)
    )
    firsts = await engine.generate(prompt_ids, first_params)
    episode = _EpisodeRun(engine, renderer, runner, lease, spec, params, count)
    episodes = await asyncio.gather(
        *(
            episode.run(i, first, prompt_ids=prompt_ids, opening=opening, chat=chat)
            for i, first in enumerate(firsts)
        )
    )
    count("episodes", len(episodes))
    count("episode_turns", sum(e.turns for e in episodes))
    return prompt_ids, list(episodes)


@dataclass(frozen=True, slots=True)
class _EpisodeRun:
    """The turns of one lease's episodes after their first model turn (what `run_episodes` was
    given)."""

    engine: Engine
    renderer: TurnRenderer
    runner: EnvRunner
    lease: wire.Lease
    spec: wire.EpisodeSpec
    params: SamplingParams
    count: Count

    async def run(
        self,
        i: int,
        first: Completion,
        *,
        prompt_ids: list[int],
        opening: list[dict[str, str]],
        chat: bool,
    ) -> Episode:
        lease, spec = self.lease, self.spec
        turns: list[tuple[Completion, list[int]]] = []  # each model turn, the ids inserted after
        messages = list(opening)
        state: dict[str, object] = {}
        used, env_s, reward, finish = 0, 0.0, None, ""
        completion = first
        seed = self.params.seed if self.params.seed is not None else 0
        while True:
            turn = len(turns) + 1
            used += len(completion.token_ids)
            text = self.renderer.codec.decode(completion.token_ids)
            messages.append({"role": "assistant", "content": text})
            sampled = [int(t) for t in completion.token_ids]
            call = EnvCall(
                reply=Reply(text, tuple(sampled), completion.finish_reason),
                messages=messages,
                turn=turn,
                turns_left=spec.max_turns - turn,
                state=state,
                prompt=[dict(m) for m in opening] if lease.messages else lease.prompt,
                answer=lease.answer,
                columns=lease.columns,
            )
            where = f"lease {lease.lease_id} (row {lease.prompt_index}), episode {i}, turn {turn}"
            latency = turn_seed(seed, i, turn, stream=1)
            outcome = await self.runner.call(call, seed=latency, where=where)
            env_s += outcome.wall_s
            state = outcome.state
            result = outcome.result
            if isinstance(result, End):
                reward, finish = result.reward, "stop"
            elif not isinstance(result, Next):
                finish = "env_error"
            elif turn >= spec.max_turns:
                finish = "max_turns"
            if finish:
                turns.append((completion, []))
                break
            assert isinstance(result, Next)
            delta = self.renderer.delta(result.messages, after=sampled, chat=chat)
            left = spec.max_episode_tokens - used - len(delta)
            if left < 1:
                finish = "max_tokens"
                self._over_budget(where, len(delta), spec.max_episode_tokens - used)
                turns.append((completion, []))
                break
            turns.append((completion, delta))
            used += len(delta)
            messages.extend({"role": r, "content": c} for r, c in result.messages)
            ids = prompt_ids + [int(t) for c, d in turns for t in (*c.token_ids, *d)]
            params = dataclasses.replace(
                self.params,
                n=1,
                max_new_tokens=min(self.params.max_new_tokens, left),
                seed=turn_seed(seed, i, turn + 1),
            )
            (completion,) = await self.engine.generate(ids, params)
        return _assemble(turns, finish=finish, reward=reward, env_s=env_s, messages=messages)

    def _over_budget(self, where: str, size: int, left: int) -> None:
        self.count("episodes_over_budget", 1)
        self.runner.warn(
            "env.over_budget",
            "environment %r answered with %d tokens on %s, %d left of episodes."
            "max_episode_tokens = %d: the episode ends (max_tokens) and its reward functions "
            "score it",
            self.spec.env,
            size,
            where,
            max(left, 0),
            self.spec.max_episode_tokens,
        )


def _assemble(
    turns: list[tuple[Completion, list[int]]],
    *,
    finish: str,
    reward: float | None,
    env_s: float,
    messages: list[dict[str, str]],
) -> Episode:
    """One `Episode` of its model turns and the ids inserted after each."""
    ids, sampled = [], []
    for completion, delta in turns:
        ids += [completion.token_ids.astype(np.int32), np.asarray(delta, np.int32)]
        sampled += [np.ones(len(completion.token_ids), bool), np.zeros(len(delta), bool)]
    completions = [c for c, _ in turns]
    lens = [len(c.token_ids) for c in completions]
    return Episode(
        token_ids=np.concatenate(ids),
        sampled=np.concatenate(sampled),
        logprobs=np.concatenate([c.logprobs for c in completions]).astype(np.float32),
        versions=np.concatenate([c.versions for c in completions]).astype(np.int32),
        kept=kept_set.concat([c.kept for c in completions], lens),
        finish_reason=finish,
        reward=None if finish == "env_error" else reward,
        turns=len(turns),
        env_s=env_s,
        messages=messages,
    )


async def score_episodes(
    rewards: Rewards, lease: wire.Lease, episodes: list[Episode]
) -> GroupScore:
    """The episodes' rewards (module docstring)."""
    out = np.array([e.reward or 0.0 for e in episodes], np.float32)
    left = [
        i for i, e in enumerate(episodes) if e.reward is None and e.finish_reason != "env_error"
    ]
    if not left:
        return GroupScore(out, 0)
    finals = [episodes[i].last_text for i in left]
    before = [episodes[i].messages[: _last_assistant(episodes[i].messages)] for i in left]
    scored = await rewards.score_episodes(lease, finals, before)
    out[left] = scored.rewards
    if len(left) < len(episodes) or not scored.parts.size:
        return GroupScore(out, scored.num_failed)
    return GroupScore(out, scored.num_failed, scored.parts)


def _last_assistant(messages: list[dict[str, str]]) -> int:
    """The index of the last assistant message (the conversation before it is its prompt)."""
    return max(i for i, m in enumerate(messages) if m["role"] == "assistant")
