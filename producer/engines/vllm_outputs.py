"""What vLLM's outputs become: completions with log-probs, kept sets and per-token versions.

Pure parts of the vllm engine (producer/engines/vllm.py), which imports them; no vLLM import.
`RequestTrack` collects the samples of one group as vLLM's outputs arrive (DELTA outputs of one
streamed request, or the final output of each one-sample request), copying token ids, log-probs
and (truncated sampling: producer/engines/vllm_kept.py) kept sets out of vLLM's objects at
once, and records the version boundaries of weight switches; `completions()` builds the
`Completion`s. `client_token_counter` reads vLLM's client-side token counts (the final path).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from common.sampling import kept_set
from common.sampling.kept_set import NO_TRUNCATION, Truncation
from producer.engines import vllm_kept
from producer.engines.base import Completion

FINISH_REASONS = {"stop": "stop", "length": "length"}


def finish_reason(vllm_reason: str | None) -> str:
    """vLLM's finish reason as ours; anything else (abort, error, unfinished) is a bug here."""
    if vllm_reason not in FINISH_REASONS:
        raise RuntimeError(f"vLLM finished a sample with reason {vllm_reason!r}")
    return FINISH_REASONS[vllm_reason]


def sampled_token_logprobs(token_ids: Sequence[int], logprobs: Any) -> list[float]:
    """Log-prob of `token_ids[i]` at each position, from vLLM's per-position logprobs.

    `logprobs` is a list of {token_id: Logprob} or a FlatLogprobs (flat lists with the start of
    each position); with `logprobs=0` a position holds exactly the sampled token. An output
    with no new token carries no positions (vLLM's delta slice `[-0:]` would be everything).
    """
    if len(token_ids) == 0:
        return []
    assert logprobs is not None, "requests ask for logprobs=0"
    assert len(logprobs) == len(token_ids), "one logprobs position per sampled token"
    starts = getattr(logprobs, "start_indices", None)
    flat_ids: Any = getattr(logprobs, "token_ids", None)
    if starts is not None and [flat_ids[s] for s in starts] == list(token_ids):
        return [logprobs.logprobs[s] for s in starts]
    return [logprobs[i][t].logprob for i, t in enumerate(token_ids)]


def token_versions(
    length: int, start_version: int, boundaries: Iterable[tuple[int, int]]
) -> np.ndarray:
    """int32 [length]: `start_version`, then from each (count, version) boundary on, `version`."""
    out = np.full(length, start_version, np.int32)
    for count, version in boundaries:
        out[count:] = version
    return out


class RequestTrack:
    """The samples of one group as their outputs arrive, and the group's version boundaries.

    `child_ids`: the vLLM request id of each sample (final path), or None (one streamed request).
    Token ids and log-probs are copied out of vLLM's output objects at once, so those objects
    die young (keeping them alive made the garbage collector a visible cost per token). With
    `truncation` active, each token's kept set is taken out too (producer/engines/vllm_kept.py).
    """

    def __init__(
        self,
        n: int,
        start_version: int,
        child_ids: list[str] | None = None,
        *,
        truncation: Truncation = NO_TRUNCATION,
        vocab_size: int = 1 << 30,
    ) -> None:
        self.n = n
        self.start_version = start_version
        self.child_ids = child_ids
        self.truncation, self.vocab_size = truncation, vocab_size
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.logps: list[list[float]] = [[] for _ in range(n)]
        self.kept: list[list[np.ndarray]] = [[] for _ in range(n)]  # per token: the other ids
        self.unknown: list[list[int]] = [[] for _ in range(n)]  # tokens whose K is not known
        self.finish: list[str | None] = [None] * n
        self.boundaries: list[tuple[tuple[int, ...], int]] = []  # (tokens per sample, version)

    def add(self, request_output: Any, index: int | None = None) -> None:
        """Append a DELTA output's samples, or (with `index`) the final output of one sample."""
        for c in request_output.outputs:
            i = c.index if index is None else index
            if self.truncation.active and len(c.token_ids):
                log_q, others, unknown = vllm_kept.kept_sets(
                    list(c.token_ids), c.logprobs, self.truncation, self.vocab_size
                )
                self.unknown[i].extend(len(self.ids[i]) + u for u in unknown)
                self.kept[i].extend(others)
                self.logps[i].extend(log_q)
            else:
                self.logps[i].extend(sampled_token_logprobs(c.token_ids, c.logprobs))
            self.ids[i].extend(c.token_ids)
            if c.finish_reason is not None:
                self.finish[i] = c.finish_reason

    def counts(self, client_count: Callable[[str], int] | None) -> tuple[int, ...]:
        """Tokens received per sample: our own, or vLLM's client counts for unfinished samples."""
        if self.child_ids is None or client_count is None:
            return tuple(len(ids) for ids in self.ids)
        return tuple(
            len(self.ids[i]) if self.finish[i] is not None else client_count(child)
            for i, child in enumerate(self.child_ids)
        )

    def switch(self, version: int, counts: Sequence[int]) -> None:
        self.boundaries.append((tuple(counts), version))

    def completions(self) -> list[Completion]:
        out = []
        for i, ids in enumerate(self.ids):
            assert ids, f"sample {i} of {self.n} produced no token"
            bounds = [(counts[i], version) for counts, version in self.boundaries]
            out.append(
                Completion(
                    token_ids=np.asarray(ids, np.int32),
                    logprobs=np.minimum(np.asarray(self.logps[i], np.float32), 0.0),
                    finish_reason=finish_reason(self.finish[i]),
                    versions=token_versions(len(ids), self.start_version, bounds),
                    kept=(
                        kept_set.from_lists(self.kept[i], self.unknown[i])
                        if self.truncation.active
                        else kept_set.KeptSets()
                    ),
                )
            )
        return out


def client_token_counter(llm: Any) -> Callable[[str], int] | None:
    """Tokens vLLM's client has received for a request id (0 for an id it does not know), read
    from its output processor: `external_req_ids[id]` -> internal id -> `request_states[...]`
    `.detokenizer.num_output_tokens()` (vLLM 0.24). None where those are missing."""
    op: Any = getattr(llm, "output_processor", None)
    if not (hasattr(op, "external_req_ids") and hasattr(op, "request_states")):
        return None

    def count(request_id: str) -> int:
        internal = op.external_req_ids.get(request_id)
        state = op.request_states.get(internal[0]) if internal else None
        return int(state.detokenizer.num_output_tokens()) if state is not None else 0

    return count
