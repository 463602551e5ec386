"""Advantages from rewards, as pure tensor functions: one value per completion.

Owns: the baselines (GRPO's group mean, RLOO's leave-one-out mean, REINFORCE++'s batch
whitening, with or without the group mean), the std scaling, and DAPO's soft overlong punishment
that is added to the rewards first. Does not: compute the loss (consumer/train/loss.py), read
config objects or groups (consumer/train/trainer.py builds `AdvantageOptions` once and calls
`advantages_of` per step). docs/loss.md lists the same formulas with their references.

Shapes: N groups, G completions per group; `rewards_NG`, `lengths_NG` (completion tokens),
`tokens_NG` (tokens the loss trains: the length less tokens with an unknown kept set).

Formulas (references: GRPO, Shao et al. 2024; Dr. GRPO, Liu et al. 2025; RLOO, Ahmadian et al.
2024; REINFORCE++, Hu 2025; DAPO, Yu et al. 2025):
- baseline "group":          a = r - mean_g
  baseline "leave-one-out":  a = r - mean of the other G - 1 = G/(G - 1)·(r - mean_g)
  then scale "group": a / (std_g + eps), std with Bessel's correction (ddof = 1), eps outside
  the root (TRL, verl); "batch": a / (std of all N·G rewards + eps); "none": a (Dr. GRPO, RLOO).
  A group whose rewards are all equal gets exactly 0.
  Completions that do not count (`valid_NG` False: episodes their environment failed) get 0
  and are left out of the means, stds and counts above (of their group and of the batch).
- baseline "group-whiten" (REINFORCE++-baseline): a = r - mean_g; "batch-whiten" (REINFORCE++):
  a = r; then whitened over the batch's trained tokens (each completion counts once per token,
  as verl's masked_whiten of the advantage broadcast over the response):
  A = (a - μ) / sqrt(σ² + 1e-8), μ = Σ n·a / Σ n, σ² = Σ n·(a - μ)² / (Σ n - 1), n = tokens_NG.
  Scale must be "none" (the whitening divides by the batch's std). Fewer than 2 tokens: 0.
- overlong (DAPO's soft overlong punishment), added to r before any of the above, for a
  completion of ℓ tokens with L = max_len and window W > 0:
  r += min(0, -(ℓ - (L - W)) / W · penalty), i.e. 0 up to L - W tokens, -penalty at L.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import get_args

import torch

from common.config import AdvBaseline, AdvScale

ADV_BASELINES: tuple[str, ...] = get_args(AdvBaseline)
ADV_SCALES: tuple[str, ...] = get_args(AdvScale)
WHITEN_EPS = 1e-8  # inside the square root, as verl's masked_whiten
WHITENED = ("group-whiten", "batch-whiten")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def group_advantages(
    rewards_NG: torch.Tensor,
    *,
    baseline: AdvBaseline = "group",
    scale: AdvScale = "group",
    eps: float = 1e-6,
    tokens_NG: torch.Tensor | None = None,
    valid_NG: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advantages `[N, G]` from rewards `[N, G]` (formulas: module docstring).

    Computed in float32 at least (float64 is kept). `tokens_NG` (trained tokens per completion)
    is needed by the whitened baselines only. `valid_NG` (bool): only those completions count
    (an episode its environment failed does not: consumer/train/batching.py); the others get 0,
    and under the group baselines a group with fewer than 2 valid completions gets 0
    throughout. All valid: exactly the unmasked result.
    """
    _check_choice("baseline", baseline, ADV_BASELINES)
    _check_choice("scale", scale, ADV_SCALES)
    if rewards_NG.ndim != 2:
        raise ValueError(f"rewards must be [n_groups, G], got shape {tuple(rewards_NG.shape)}")
    if rewards_NG.shape[1] < 2:
        raise ValueError(
            f"G = {rewards_NG.shape[1]}: GRPO needs at least 2 completions per group "
            "(an advantage is relative to the other samples of the same prompt)"
        )
    r_NG = rewards_NG.to(torch.promote_types(rewards_NG.dtype, torch.float32))
    if valid_NG is not None and not bool(valid_NG.all()):
        return _masked(r_NG, valid_NG.to(torch.bool), baseline, scale, eps, tokens_NG)
    if baseline in WHITENED:
        return _whitened(r_NG, baseline, scale, tokens_NG)
    constant_N1 = (r_NG == r_NG[:, :1]).all(dim=1, keepdim=True)
    adv_NG = r_NG - r_NG.mean(dim=1, keepdim=True)
    if baseline == "leave-one-out":
        G = r_NG.shape[1]
        adv_NG = adv_NG * (G / (G - 1))
    if scale == "group":
        adv_NG = adv_NG / (r_NG.std(dim=1, keepdim=True, correction=1) + eps)
    elif scale == "batch" and r_NG.numel() > 0:
        adv_NG = adv_NG / (r_NG.std(correction=1) + eps)
    return torch.where(constant_N1, torch.zeros_like(adv_NG), adv_NG)


def _masked(
    r_NG: torch.Tensor,
    valid_NG: torch.Tensor,
    baseline: str,
    scale: str,
    eps: float,
    tokens_NG: torch.Tensor | None,
) -> torch.Tensor:
    """`group_advantages` over the valid completions only (the rest 0)."""
    n_N1 = valid_NG.sum(dim=1, keepdim=True).to(r_NG.dtype)
    mean_N1 = torch.where(valid_NG, r_NG, 0.0).sum(dim=1, keepdim=True) / n_N1.clamp(min=1)
    dev_NG = torch.where(valid_NG, r_NG - mean_N1, 0.0)
    if baseline in WHITENED:
        a_NG = dev_NG if baseline == "group-whiten" else torch.where(valid_NG, r_NG, 0.0)
        if tokens_NG is None or tuple(tokens_NG.shape) != tuple(r_NG.shape):
            raise ValueError(f"baseline {baseline!r} needs tokens_NG, the shape of the rewards")
        adv_NG = _whitened(a_NG, "batch-whiten", scale, torch.where(valid_NG, tokens_NG, 0))
        return torch.where(valid_NG, adv_NG, torch.zeros_like(adv_NG))
    high = torch.where(valid_NG, r_NG, -math.inf).amax(dim=1, keepdim=True)
    low = torch.where(valid_NG, r_NG, math.inf).amin(dim=1, keepdim=True)
    flat_N1 = (n_N1 < 2) | (high == low)
    adv_NG = dev_NG
    if baseline == "leave-one-out":
        adv_NG = adv_NG * (n_N1 / (n_N1 - 1).clamp(min=1))
    if scale == "group":
        var_N1 = (dev_NG**2).sum(dim=1, keepdim=True) / (n_N1 - 1).clamp(min=1)
        adv_NG = adv_NG / (var_N1.sqrt() + eps)
    elif scale == "batch" and bool(valid_NG.any()):
        adv_NG = adv_NG / (r_NG[valid_NG].std(correction=1).nan_to_num(0.0) + eps)
    return torch.where(flat_N1 | ~valid_NG, torch.zeros_like(adv_NG), adv_NG)


def _whitened(
    r_NG: torch.Tensor, baseline: str, scale: str, tokens_NG: torch.Tensor | None
) -> torch.Tensor:
    if scale != "none":
        raise ValueError(f"baseline {baseline!r} whitens over the batch itself: use scale 'none'")
    if tokens_NG is None or tuple(tokens_NG.shape) != tuple(r_NG.shape):
        raise ValueError(f"baseline {baseline!r} needs tokens_NG, the shape of the rewards")
    a_NG = r_NG - r_NG.mean(dim=1, keepdim=True) if baseline == "group-whiten" else r_NG
    n_NG = tokens_NG.to(r_NG.dtype)
    total = n_NG.sum()
    if not total >= 2:
        return torch.zeros_like(a_NG)
    mu = (n_NG * a_NG).sum() / total
    var = (n_NG * (a_NG - mu) ** 2).sum() / (total - 1)
    return (a_NG - mu) * torch.rsqrt(var + WHITEN_EPS)


def overlong_penalty(
    lengths_NG: torch.Tensor, *, max_len: int, window: int, penalty: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment per completion (<= 0; formula: module docstring)."""
    if not 0 < window <= max_len:
        raise ValueError(f"overlong window must be in [1, max_len = {max_len}], got {window}")
    exceed_NG = lengths_NG.to(torch.float64) - (max_len - window)
    return (-exceed_NG / window * penalty).clamp(max=0.0)


@dataclass(frozen=True, slots=True)
class AdvantageOptions:
    """Every option of `advantages_of`, checked once at construction.

    baseline, scale, eps: see `group_advantages`. overlong_window: W (0 = off), with
    overlong_penalty and max_len (sampling.max_new_tokens): see `overlong_penalty`.
    """

    baseline: AdvBaseline = "group"
    scale: AdvScale = "group"
    eps: float = 1e-6
    overlong_window: int = 0
    overlong_penalty: float = 1.0
    max_len: int = 0

    def __post_init__(self) -> None:
        _check_choice("baseline", self.baseline, ADV_BASELINES)
        _check_choice("scale", self.scale, ADV_SCALES)
        if self.baseline in WHITENED and self.scale != "none":
            raise ValueError(f"baseline {self.baseline!r} whitens over the batch: scale 'none'")
        if self.overlong_window and not 0 < self.overlong_window <= self.max_len:
            raise ValueError(f"overlong_window must be in [0, max_len = {self.max_len}]")

    @property
    def needs_tokens(self) -> bool:
        """Whether `advantages_of` reads `tokens_NG` (the whitened baselines)."""
        return self.baseline in WHITENED


def advantages_of(
    rewards_NG: torch.Tensor,
    options: AdvantageOptions,
    *,
    lengths_NG: torch.Tensor | None = None,
    tokens_NG: torch.Tensor | None = None,
    valid_NG: torch.Tensor | None = None,
) -> torch.Tensor:
    """The advantages of one batch: overlong punishment added to the rewards (when on, from
    `lengths_NG`), then `group_advantages` (`tokens_NG` for the whitened baselines, `valid_NG`
    the completions that count)."""
    o = options
    if o.overlong_window:
        if lengths_NG is None:
            raise ValueError("the overlong punishment needs lengths_NG")
        rewards_NG = rewards_NG + overlong_penalty(
            lengths_NG, max_len=o.max_len, window=o.overlong_window, penalty=o.overlong_penalty
        ).to(rewards_NG.dtype)
    return group_advantages(
        rewards_NG,
        baseline=o.baseline,
        scale=o.scale,
        eps=o.eps,
        tokens_NG=tokens_NG,
        valid_NG=valid_NG,
    )
