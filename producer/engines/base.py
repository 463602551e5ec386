"""The engine contract: sampling parameters, completions, and the `Engine` protocol.

Every engine (fake, hf, vllm) keeps this contract (tests/integration/test_engine_contract.py
checks it):
- `generate(prompt_ids, params)` returns exactly `params.n` completions of one prompt;
- each completion's `token_ids` (int32) and `logprobs` (float32) have equal length in
  [1, params.max_new_tokens]; `logprobs[i]` is the log-probability of exactly `token_ids[i]` under
  the sampling distribution, log_softmax(logits / temperature), finite and <= 0;
- with `params.truncation.active` (top-k, top-p, min-p), the sampling distribution is q, the softmax
  over each step's kept set K (common/sampling/kept_set.py): `logprobs[i]` is log q, and `kept`
  holds every token's K exactly as the engine sampled from it (`KeptSets`: offsets [L + 1], the
  other kept ids, at most `max_kept` per token; a token whose K the engine cannot know exactly is
  listed in `kept.unknown`, with an empty set and log-prob 0: it is never trained). Without
  truncation `kept` is empty;
- `versions[i]` is the weight version that produced token i (int32); the engine's `version`
  before the call is the version of the first token;
- `finish_reason` is "stop" (the completion ends with an EOS/stop token, included) or "length";
- `load_weights(directory, version)` loads `directory/model.safetensors` in place; generation
  calls that start afterwards use the new weights (the prefix cache is not reused across it).

This module imports neither torch nor any engine: the engines import it, and the factory
(`producer.engines.make_engine`) imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from common.sampling.kept_set import NO_TRUNCATION, KeptSets, Truncation


@dataclass(frozen=True, slots=True)
class SamplingParams:
    n: int
    temperature: float
    max_new_tokens: int
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    truncation: Truncation = NO_TRUNCATION  # top-k / top-p / min-p, and max_kept


@dataclass(frozen=True, slots=True, eq=False)
class Completion:
    token_ids: np.ndarray  # int32 [L]
    logprobs: np.ndarray  # float32 [L]
    finish_reason: str  # "stop" | "length"
    versions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # int32 [L]
    kept: KeptSets = field(default_factory=KeptSets)  # the kept sets (truncated sampling only)


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
