"""Kept sets from vLLM's processed log-probs: how the vllm engine records truncated sampling.

Pure functions (no vLLM import): producer/engines/vllm.py calls them, tests/unit feeds them fake
outputs. What vLLM 0.24 offers (read from its source: vllm/v1/sample/sampler.py, the V1 and
V2 model runners, ops/topk_topp_sampler.py): with `logprobs_mode="processed_logprobs"` the
log-probs it returns are those of the distribution it sampled from, after temperature, min-p,
top-k and top-p (in that order), with every dropped token at -inf; a request with `logprobs=N`
gets, per position, the sampled token first and then the N highest processed values. So:

    K = {sampled} ∪ {ids among the N with a finite log-prob};  log q(a) = the sampled entry.

This is exact only when K fits in the N reported: we ask for N = max_kept + 1 (the engine arg
`max_logprobs` raised to match) and top_k <= max_kept, so a position whose N candidates are all
finite has |K| > max_kept (ties at vLLM's top-k boundary keep more than k) and its K is not
known. Such a token, and one whose sampled entry is not finite (seen with vLLM's Triton top-p
pivot: SkyRL#2082), or whose reported set is inconsistent (the sampled id missing from it, or
its probabilities not summing to 1 within `SUM_TOL`), is recorded as unknown: kept in the
completion, never trained, counted by the learner. vLLM never recomputes K for us and neither
does the learner: K is what the engine sampled from, whatever its kernel did with ties.

vLLM 0.28 adds `return_sampling_mask` (the kept set itself, V2 model runner only); until the
pinned release has it, the recipe above is the one. Releases before `MIN_VERSION` are refused
for truncated sampling at start (`support_problem`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from common.sampling.kept_set import Truncation

MIN_VERSION = (0, 24, 0)
SUM_TOL = 1e-3  # |logsumexp over K of the processed log-probs|: q sums to 1 in float32


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def support_problem(version: str) -> str | None:
    """Why this vLLM release cannot record kept sets exactly (None when it can)."""
    if _release(version) >= MIN_VERSION:
        return None
    need = ".".join(map(str, MIN_VERSION))
    return (
        f"truncated sampling (sampling.top_p < 1, top_k > 0 or min_p > 0) with the vllm engine "
        f"needs vLLM >= {need} (processed log-probs of the top candidates give each token's "
        f"kept set); this host has vLLM {version}: upgrade it, or sample untruncated"
    )


def num_candidates(truncation: Truncation, vocab_size: int) -> int:
    """N, the `logprobs` a request asks for (0 without truncation): max_kept + 1, at most V."""
    return min(truncation.max_kept + 1, vocab_size) if truncation.active else 0


def request_kwargs(truncation: Truncation, vocab_size: int) -> dict[str, Any]:
    """The `vllm.SamplingParams` keywords of the truncation (top_k <= max_kept always)."""
    if not truncation.active:
        return {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "logprobs": 0}
    k = truncation.k_bound(vocab_size)
    return {
        "top_p": truncation.top_p,
        "top_k": k if k < vocab_size else 0,  # 0 = off in vLLM 0.24 (-1 is still accepted)
        "min_p": truncation.min_p,
        "logprobs": num_candidates(truncation, vocab_size),
    }


def position_entries(logprobs: Any, i: int) -> tuple[list[int], list[float]]:
    """(ids, log-probs) vLLM reported at position i of a FlatLogprobs: the sampled token
    first, then the top candidates."""
    start = logprobs.start_indices[i]
    ends = getattr(logprobs, "end_indices", None)
    if ends is not None:
        end = ends[i]
    elif i + 1 < len(logprobs.start_indices):
        end = logprobs.start_indices[i + 1]
    else:
        end = len(logprobs.token_ids)
    return list(logprobs.token_ids[start:end]), list(logprobs.logprobs[start:end])


def kept_of_position(
    token: int,
    ids: list[int],
    logps: list[float],
    *,
    num_top: int,
    truncation: Truncation,
    vocab_size: int,
) -> tuple[float, np.ndarray] | None:
    """(log q, the other kept ids ascending) of one position, or None when K is not known
    exactly (see the module doc). `ids[0]` / `logps[0]` are the sampled entry."""
    if not ids or ids[0] != token or not math.isfinite(logps[0]):
        return None
    finite = {t: lp for t, lp in zip(ids[1:], logps[1:], strict=True) if math.isfinite(lp)}
    complete = len(finite) < num_top or num_top >= vocab_size
    if not complete or len(finite) > truncation.max_kept or token not in finite:
        return None
    values = np.fromiter(finite.values(), np.float64, len(finite))
    top = values.max()
    if abs(top + math.log(np.exp(values - top).sum())) > SUM_TOL:
        return None
    others = np.array(sorted(t for t in finite if t != token), np.int32)
    return min(float(logps[0]), 0.0), others


def kept_sets(
    token_ids: list[int], logprobs: Any, truncation: Truncation, vocab_size: int
) -> tuple[list[float], list[np.ndarray], list[int]]:
    """Per position of one sample's new tokens: log q (0.0 where unknown), the other kept ids,
    and the positions (indices into `token_ids`) whose kept set is unknown."""
    num_top = num_candidates(truncation, vocab_size)
    assert hasattr(logprobs, "start_indices"), "truncated requests ask for flat_logprobs=True"
    assert len(logprobs) == len(token_ids), "one logprobs position per sampled token"
    log_q: list[float] = []
    others: list[np.ndarray] = []
    unknown: list[int] = []
    for i, token in enumerate(token_ids):
        ids, logps = position_entries(logprobs, i)
        got = kept_of_position(
            token, ids, logps, num_top=num_top, truncation=truncation, vocab_size=vocab_size
        )
        if got is None:
            unknown.append(i)
            log_q.append(0.0)
            others.append(np.zeros(0, np.int32))
        else:
            log_q.append(got[0])
            others.append(got[1])
    return log_q, others, unknown
