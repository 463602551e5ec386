"""Multi-turn episodes are exact by construction: the learner trains on the very ids the engine
sampled, and recomputes their log-probs to float32 rounding (|Δ| < 1e-4), over >= 3 model turns
with environment messages between them.

A tiny Llama with a byte-level BPE tokenizer and SmolLM2's ChatML template
(tests/tiny_models.py `build_chat_model`), the hf engine, the `echo` environment (3 turns), the
wire both ways, the learner's `logprobs` and `collate`. The naive way (the conversation's text
rendered again by the chat template and tokenized whole) gives other ids: the test shows it does
here, so the exactness is not an accident of a tokenizer without merges. The same on the real
SmolLM2-135M-Instruct, and the naive way's per-token ratio: tests/integration/test_real_model.py
and bench/episodes_exact.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from tiny_models import build_chat_model

from common import config as C
from common import wire
from producer.engines.base import SamplingParams
from producer.engines.hf import HFEngine
from producer.episodes.loop import Episode, run_episodes
from producer.episodes.render import TurnRenderer
from producer.episodes.runner import EnvRunner
from producer.groups import group_of
from producer.rewards.scoring import GroupScore
from producer.tokenizer import PromptCodec

G = 4
SPEC = wire.EpisodeSpec(
    env="env_fixtures:echo",
    max_turns=3,
    max_episode_tokens=256,
    timeout_s=5.0,
    latency_s=0.0,
    latency_alpha=1.5,
)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_model(tmp_path_factory.mktemp("chat-model"))


@pytest.fixture
async def sampled(chat_model: Path) -> AsyncIterator[tuple[PromptCodec, wire.Group, list[Episode]]]:
    codec = PromptCodec(chat_model, "chat", vocab_size=320)
    engine = HFEngine(chat_model, device="cpu", seed=0)
    await engine.load_weights(chat_model, 0)
    runner = EnvRunner(SPEC, workers=1, inline=True)
    lease = wire.Lease(1, 0, 0, 0, "What is 123 * 456?", "56088", (), "")
    params = SamplingParams(
        n=G, temperature=1.0, max_new_tokens=12, seed=5, stop_token_ids=codec.stop_ids
    )
    try:
        prompt, episodes = await run_episodes(
            engine,
            TurnRenderer(codec),
            runner,
            lease=lease,
            spec=SPEC,
            params=params,
            count=lambda key, n: None,
        )
    finally:
        await engine.close()
    scored = GroupScore(np.array([e.reward or 0.0 for e in episodes], np.float32), 0)
    group = group_of("p0", lease, prompt, episodes, scored, temperature=1.0, gen_s=0.0)
    limits = wire.Limits(vocab_size=320, group_size=G, temperature=1.0, max_completion_tokens=256)
    return codec, wire.decode(wire.encode(group), limits), episodes


async def test_learner_logprobs_equal_the_engines_over_three_turns(chat_model, sampled):
    from consumer.train.trainer import DeviceTrainer

    _, group, episodes = sampled
    assert all(e.turns == 3 for e in episodes)
    assert all((~e.sampled).any() for e in episodes)  # environment tokens between the turns
    cfg = C.Config()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, device="cpu"))
    learner = DeviceTrainer(cfg, chat_model).logprobs([group])
    for e, logp in zip(episodes, learner, strict=True):
        assert len(logp) == len(e.logprobs) == int(e.sampled.sum())
        assert np.abs(logp - e.logprobs).max() < 1e-4


async def test_the_learner_trains_on_exactly_the_sampled_ids(sampled):
    import torch

    from consumer.train.batching import collate, rows_of

    _, group, episodes = sampled
    rows = rows_of([group], np.ones((1, G)))
    mb = collate(rows, list(range(G)), pad_id=0, device=torch.device("cpu"))
    trained = mb.tokens_N.numpy()
    assert trained.tolist() == np.concatenate([e.token_ids[e.sampled] for e in episodes]).tolist()
    for row, e in zip(rows, episodes, strict=True):
        assert row.ids[row.prompt_len :].tolist() == e.token_ids.tolist()
    assert mb.num_tokens == sum(int(e.sampled.sum()) for e in episodes)  # the normaliser


async def test_rendering_the_conversation_again_would_change_the_ids(sampled):
    codec, group, episodes = sampled
    tok = codec.tokenizer
    changed = 0
    for _i, e in enumerate(episodes):
        text = tok.apply_chat_template(e.messages, tokenize=False)
        naive = tok(text, add_special_tokens=False)["input_ids"]
        ours = group.prompt_ids.tolist() + e.token_ids.tolist()
        changed += naive[: len(ours)] != ours
    assert changed >= 1
