"""The sampling distribution's log-prob rule, shared by the learner and the engines.

Owns one rule: a token's log-prob is `log_softmax(logits / temperature)[token]`, computed in float32
at least, the same on both sides, so behaviour and learner log-probs of the same weights agree to
float32 rounding. Also the entropy of that distribution, the temperature check, and, for truncated
sampling, the kept set of our own sampler batched (`truncated_logits`: the rule of
common/sampling/kept_set.py, which also holds its per-token reference) and the log-prob renormalised
over recorded kept sets (`kept_set_logprobs`: what the learner's LM head computes chunk by chunk).
Does not own: sampling itself (producer/engines/hf_batch.py), or what the loss does with log-probs
(consumer/train/loss.py).

Shapes: any leading shape, last axis V (vocabulary); names carry `_BTV` / `_BT` for the learner's
[rows, positions, vocabulary] case.
"""

from __future__ import annotations

import math

import torch

from common.sampling.kept_set import Truncation


def check_temperature(temperature: float) -> None:
    """`ValueError` unless `temperature` is a finite number > 0."""
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")


def sampled_logprobs(
    logits_BTV: torch.Tensor, tokens_BT: torch.Tensor, *, temperature: float
) -> torch.Tensor:
    """log_softmax(logits / temperature) at `tokens`: the log-prob under the sampling distribution.

    Computed in float32 at least (float64 is kept). Uses gather - logsumexp, which keeps no
    [B, T, V] output alive for backward (log_softmax would). Any leading shape works.
    """
    check_temperature(temperature)
    dtype = torch.promote_types(logits_BTV.dtype, torch.float32)
    z_BTV = logits_BTV.to(dtype)
    if temperature != 1.0:
        z_BTV = z_BTV / temperature
    picked_BT = z_BTV.gather(-1, tokens_BT.long().unsqueeze(-1)).squeeze(-1)
    return picked_BT - torch.logsumexp(z_BTV, dim=-1)


def entropy_from_logits(logits_BTV: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """Per-position entropy (nats) of softmax(logits / temperature); -inf logits count as 0."""
    check_temperature(temperature)
    dtype = torch.promote_types(logits_BTV.dtype, torch.float32)
    logp_BTV = torch.log_softmax(logits_BTV.to(dtype) / temperature, dim=-1)
    p_BTV = logp_BTV.exp()
    return -(p_BTV * torch.where(p_BTV > 0, logp_BTV, 0.0)).sum(-1)


def truncated_logits(
    logits_BV: torch.Tensor, truncation: Truncation, *, temperature: float
) -> torch.Tensor:
    """z = logits / T (float32 at least) with -inf outside each row's kept set: rules 1-3 of
    common/sampling/kept_set.py (min-p, top-k with ties and the max_kept cap, top-p by the mass
    strictly above), batched over the leading axes. K of a row is where the result is finite; its
    softmax is q. Without truncation, z itself (no sort is paid).

    One stable descending sort per row (ties in ascending id order, which is the max_kept
    cut's order); top-p works on the sorted probabilities, a tie group taking the mass above
    its first member."""
    check_temperature(temperature)
    z_BV = logits_BV.to(torch.promote_types(logits_BV.dtype, torch.float32))
    if temperature != 1.0:
        z_BV = z_BV / temperature
    if not truncation.active:
        return z_BV
    vocab = z_BV.shape[-1]
    vals, order = torch.sort(z_BV, dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=z_BV.device)
    keep = torch.isfinite(vals)
    if truncation.min_p > 0:
        keep &= vals >= vals[..., :1] + math.log(truncation.min_p)
    k = truncation.k_bound(vocab)
    if k < vocab:
        keep &= vals >= vals[..., k - 1 : k]  # the remaining ones are a prefix: see the doc
    keep &= rank < truncation.max_kept
    if truncation.top_p < 1:
        p = torch.softmax(torch.where(keep, vals, -math.inf), dim=-1)
        above = torch.cumsum(p, dim=-1)
        above = torch.cat([torch.zeros_like(above[..., :1]), above[..., :-1]], dim=-1)
        first = torch.ones_like(keep)
        first[..., 1:] = vals[..., 1:] != vals[..., :-1]
        group_start = torch.cummax(torch.where(first, rank, 0), dim=-1).values
        keep &= above.gather(-1, group_start) < truncation.top_p
    kept_BV = torch.zeros_like(keep).scatter_(-1, order, keep)
    return z_BV.masked_fill(~kept_BV, -math.inf)


def kept_set_logprobs(
    logits_NV: torch.Tensor,
    kept_NK: torch.Tensor,
    valid_NK: torch.Tensor,
    *,
    temperature: float,
) -> torch.Tensor:
    """log π_K(a) per row: z_a - logsumexp over the row's kept ids of z (z = logits / T).

    `kept_NK` (int) holds each row's kept ids with the sampled token in column 0 (the layout of
    consumer/train/batching.py); `valid_NK` marks the real entries (the rest is padding).
    Computed in float32 at least; the learner's LM head computes the same chunk by chunk."""
    check_temperature(temperature)
    dtype = torch.promote_types(logits_NV.dtype, torch.float32)
    z_NV = logits_NV.to(dtype)
    if temperature != 1.0:
        z_NV = z_NV / temperature
    z_NK = z_NV.gather(-1, kept_NK.long()).masked_fill(~valid_NK, -math.inf)
    return z_NK[..., 0] - torch.logsumexp(z_NK, dim=-1)
