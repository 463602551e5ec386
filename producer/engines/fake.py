"""The `fake` engine: no model, seeded random tokens with configurable lengths and latency.

Used by tests, the stress command and transport benchmarks; its rewards are
producer/rewards/scoring.py's `FakeRewards`. Keeps the contract of producer/engines/base.py:
log-probs are those of a uniform policy, every token carries the version loaded when the call
started.
With truncated sampling each token gets a kept set of random ids around it (top-k: k of them;
otherwise a size drawn in [1, max_kept]) and the uniform log-prob over that set, so transport
tests carry kept sets of realistic sizes.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np

from common.sampling import kept_set
from common.sampling.kept_set import Truncation
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
            kept, logps = kept_set.KeptSets(), np.full(length, logp, np.float32)
            if params.truncation.active:
                kept, logps = self._kept_sets(ids, params.truncation)
            out.append(
                Completion(
                    token_ids=ids,
                    logprobs=logps,
                    finish_reason="stop" if stop else "length",
                    versions=np.full(length, version, np.int32),
                    kept=kept,
                )
            )
        return out

    def _kept_sets(
        self, ids: np.ndarray, truncation: Truncation
    ) -> tuple[kept_set.KeptSets, np.ndarray]:
        """Random kept sets around `ids` and the uniform log-prob over each."""
        rng = np.random.default_rng(self._rng.getrandbits(64))
        bound = truncation.k_bound(self._vocab)
        others = []
        for token in ids.tolist():
            size = bound if truncation.top_k else int(rng.integers(1, bound + 1))
            picked = rng.choice(self._vocab - 1, size - 1, replace=False).astype(np.int32)
            picked[picked >= token] += 1  # every id but the token itself
            others.append(np.sort(picked))
        sizes = np.array([len(o) + 1 for o in others], np.float32)
        return kept_set.from_lists(others), -np.log(sizes)

    async def load_weights(self, directory: Path, version: int) -> None:
        self._version = version

    async def close(self) -> None:
        return None
