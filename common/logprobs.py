"""The sampling distribution's log-prob rule, shared by the learner and the engines.

Owns one rule: a token's log-prob is `log_softmax(logits / temperature)[token]`, computed in
float32 at least, the same on both sides, so behaviour and learner log-probs of the same weights
agree to float32 rounding. Also the entropy of that distribution, and the temperature check.
Does not own: sampling itself (producer/engines/hf_batch.py), or what the loss does with log-probs
(consumer/train/loss.py).

Shapes: any leading shape, last axis V (vocabulary); names carry `_BTV` / `_BT` for the learner's
[rows, positions, vocabulary] case.
"""

from __future__ import annotations

import math

import torch


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
