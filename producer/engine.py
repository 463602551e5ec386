"""The engine contract, the fake engine, and `make_engine`.

Every engine keeps this contract (tests/integration/test_engine_contract.py checks it):
- `generate(prompt_ids, params)` returns exactly `params.n` completions of one prompt;
- each completion's `token_ids` (int32) and `logprobs` (float32) have equal length in
  [1, params.max_new_tokens]; `logprobs[i]` is the log-probability of exactly `token_ids[i]` under
  the sampling distribution, log_softmax(logits / temperature), finite and <= 0;
- `versions[i]` is the weight version that produced token i (int32); the engine's `version`
  before the call is the version of the first token;
- `finish_reason` is "stop" (the completion ends with an EOS/stop token, included) or "length";
- `load_weights(directory, version)` loads `directory/model.safetensors` in place; generation
  calls that start afterwards use the new weights (the prefix cache is not reused across it).

Heavy engines (`hf`: transformers; `vllm`) are imported lazily by `make_engine`, so fake-engine
producers never import torch.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from common.config import Config


@dataclass(frozen=True, slots=True)
class SamplingParams:
    n: int
    temperature: float
    max_new_tokens: int
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, eq=False)
class Completion:
    token_ids: np.ndarray  # int32 [L]
    logprobs: np.ndarray  # float32 [L]
    finish_reason: str  # "stop" | "length"
    versions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # int32 [L]


class Engine(Protocol):
    """What the producer loop needs of a generation engine."""

    @property
    def version(self) -> int:
        """Version of the weights that the next generation starts with (-1 before any load)."""
        ...

    @property
    def vocab_size(self) -> int: ...

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]: ...

    async def load_weights(self, directory: Path, version: int) -> None: ...

    async def close(self) -> None: ...


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


def make_engine(cfg: Config, *, model_dir: Path | None, vocab_size: int, seed: int) -> Engine:
    """Build the engine `cfg.producer.engine` names. `model_dir` is unused by the fake engine."""
    name = cfg.producer.engine
    if name == "fake":
        f = cfg.fake
        return FakeEngine(
            vocab_size=vocab_size,
            eos_token_id=vocab_size - 1,
            seed=seed,
            min_tokens=f.min_tokens,
            max_tokens=f.max_tokens,
            long_tail=f.long_tail,
            latency_s=f.latency_s,
            per_token_s=f.per_token_s,
            jitter=f.jitter,
            slow_factor=cfg.producer.slow_factor,
        )
    assert model_dir is not None, "hf and vllm engines need a model directory"
    if name == "hf":
        from producer.engine_hf import HFEngine

        return HFEngine(model_dir, device=cfg.producer.device, seed=seed)
    if name == "vllm":
        from producer.engine_vllm import VLLMEngine

        return VLLMEngine(model_dir, cfg.vllm, seed=seed)
    raise AssertionError(f"unknown engine {name!r} (config validation lists the choices)")
