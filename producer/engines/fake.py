"""The `fake` engine: no model, seeded random tokens with configurable lengths and latency.

Used by tests, the stress command and transport benchmarks; its rewards are
producer/scoring.py's `FakeRewards`. Keeps the contract of producer/engines/base.py: log-probs
are those of a uniform policy, every token carries the version loaded when the call started.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np

from producer.engines.base import Completion, SamplingParams


class FakeEngine:
    """No model: random tokens with seeded lengths and latency, for transport and stress tests.

    Latency of one `generate` call (one group) in seconds:
    `(latency_s + per_token_s * longest) * slow_factor * uniform(1 - jitter, 1 + jitter)`.
    Log-probs are uniform over the vocabulary (`-log(vocab)`), i.e. the behaviour policy of a
    learner that predicts uniformly; with `long_tail` a completion takes `max_tokens` tokens.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        eos_token_id: int,
        seed: int = 0,
        min_tokens: int = 4,
        max_tokens: int = 16,
        long_tail: float = 0.0,
        latency_s: float = 0.0,
        per_token_s: float = 0.0,
        jitter: float = 0.0,
        slow_factor: float = 1.0,
    ) -> None:
        assert 1 <= min_tokens <= max_tokens
        assert vocab_size > 1
        self._vocab = vocab_size
        self._eos = eos_token_id
        self._rng = random.Random(seed)
        self._min, self._max, self._tail = min_tokens, max_tokens, long_tail
        self._latency_s, self._per_token_s = latency_s, per_token_s
        self._jitter, self._slow = jitter, slow_factor
        self._version = -1

    @property
    def version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        return self._vocab

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        version = self._version
        top = min(self._max, params.max_new_tokens)
        lengths = [
            top if self._rng.random() < self._tail else self._rng.randint(min(self._min, top), top)
            for _ in range(params.n)
        ]
        delay = (self._latency_s + self._per_token_s * max(lengths)) * self._slow
        if self._jitter:
            delay *= self._rng.uniform(1 - self._jitter, 1 + self._jitter)
        if delay > 0:
            await asyncio.sleep(delay)
        out = []
        logp = -float(np.log(self._vocab))
        for length in lengths:
            ids = np.array([self._rng.randrange(self._vocab) for _ in range(length)], np.int32)
            stop = length < top
            if stop:
                ids[-1] = self._eos
            out.append(
                Completion(
                    token_ids=ids,
                    logprobs=np.full(length, logp, np.float32),
                    finish_reason="stop" if stop else "length",
                    versions=np.full(length, version, np.int32),
                )
            )
        return out

    async def load_weights(self, directory: Path, version: int) -> None:
        self._version = version

    async def close(self) -> None:
        return None
