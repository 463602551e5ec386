"""The GRPO loss family as pure tensor functions (no I/O, no model, no config objects).

Shapes: N groups, G completions per group, B = N·G rows, T token positions, V vocabulary.
Names carry their shape (`rewards_NG`, `logp_BT`, `mask_BT`). Log-prob roles: `logp` (learner,
with gradient), `old_logp` (learner before this update, detached), `behavior_logp` (the policy
that sampled), `ref_logp` (reference policy for the KL penalty).

Formulas (docs/loss.md has the same list with the defaults):
- Advantages, per group g of G rewards r:
  `scale="group"`: A = (r - mean_g) / (std_g + eps), std with Bessel's correction (ddof = 1),
  eps outside the square root; `scale="batch"`: the same with the std of all N·G rewards;
  `scale="none"`: A = r - mean_g (Dr. GRPO). A group whose rewards are all equal gets exactly 0.
- Sampling distribution: `logp = log_softmax(logits / temperature)[token]` (`sampled_logprobs`),
  on the learner and on every engine alike.
- TIS weight (detached): token level `rho_t = exp(old_t - behavior_t)`; sequence level
  `rho_b = exp(Σ_t mask·(old_t - behavior_t))`, broadcast over the row. Log-ratios are clamped to
  ±20 before exp. `mode="truncate"`: w = clamp(rho, cap_min, cap); `mode="mask"`:
  w = rho · 1[cap_min <= rho <= cap] (IcePop / MIS). Padding gets 0.
- Policy term per token: r = exp(clamp(logp - old_logp, ±20));
  L = max(-A·r, -A·clip(r, 1 - clip_low, 1 + clip_high)); with dual clip c and A < 0:
  L = min(L, -c·A); then L = w·L.
- KL to the reference (never IS-weighted): k1 = logp - ref; k2 = ½(logp - ref)²;
  k3 = exp(x) - x - 1 with x = clamp(ref - logp, ±20), k3 clamped to [-10, 10].
- Aggregation (`aggregate`): token-mean Σ/Σmask; token-sum Σ; seq-mean-token-mean mean over
  non-empty rows of the row's token mean; seq-mean-token-sum mean over non-empty rows of row sums;
  seq-mean-token-sum-norm Σ / (non-empty rows · norm_const) (Dr. GRPO). With `global_tokens`
  (token-mean) or `global_seqs` (seq-* modes) the denominators are those of the whole batch, so
  losses of micro-batches add up exactly to the loss of the batch.
Total: `policy_term + beta · aggregate(kl)`.

Padding positions may hold anything (NaN, inf): inputs are sanitised with `torch.where` before any
arithmetic, so neither the value nor the gradient sees them. Gradients flow only through `logp`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

AdvScale = Literal["group", "batch", "none"]
TISLevel = Literal["token", "sequence"]
TISMode = Literal["truncate", "mask"]
KLKind = Literal["k1", "k2", "k3"]
AggMode = Literal[
    "token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0
METRIC_KEYS = (
    "clip_frac_low",
    "clip_frac_high",
    "tis_weight_mean",
    "tis_frac_truncated",
    "tis_weight_sum",
    "tis_weight_sq_sum",
    "behavior_gap_abs_mean",
    "behavior_gap_abs_max",
    "kl_behavior",
    "ratio_min",
    "ratio_max",
    "kl_ref",
    "num_tokens",
)


@dataclass(frozen=True, slots=True)
class TISConfig:
    level: TISLevel = "token"
    mode: TISMode = "truncate"
    cap: float = 2.0
    cap_min: float | None = None


def _choose(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def sampled_logprobs(
    logits_BTV: torch.Tensor, tokens_BT: torch.Tensor, *, temperature: float
) -> torch.Tensor:
    """log_softmax(logits / temperature) at `tokens` (float32 at least; float64 is kept)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    dtype = torch.float64 if logits_BTV.dtype == torch.float64 else torch.float32
    logp_BTV = torch.log_softmax(logits_BTV.to(dtype) / temperature, dim=-1)
    return logp_BTV.gather(-1, tokens_BT.long().unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits_BTV: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """Per-position entropy (nats) of the sampling distribution softmax(logits / temperature)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    dtype = torch.float64 if logits_BTV.dtype == torch.float64 else torch.float32
    logp_BTV = torch.log_softmax(logits_BTV.to(dtype) / temperature, dim=-1)
    return -(logp_BTV.exp() * logp_BTV).sum(-1)


def needs_old_logp_pass(updates_per_batch: int) -> bool:
    """Whether the trainer must compute `old_logp` in a separate no-grad forward.

    When one optimizer step consumes the whole batch (`updates_per_batch == 1`), the policy
    before the update is the policy of this very forward: `old_logp = logp.detach()` and the
    ratio is exactly 1 in value (its gradient is that of logp). No second forward is paid.
    With k > 1 updates per batch the weights move between them, so old log-probs must be
    computed once, before the first update, under no_grad.
    """
    if updates_per_batch < 1:
        raise ValueError(f"updates_per_batch must be >= 1, got {updates_per_batch}")
    return updates_per_batch > 1


def group_advantages(
    rewards_NG: torch.Tensor, *, scale: AdvScale = "group", eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages `[N, G]` (see the module docstring for the conventions)."""
    _choose("scale", scale, ("group", "batch", "none"))
    if rewards_NG.ndim != 2:
        raise ValueError(f"rewards must be [n_groups, G], got shape {tuple(rewards_NG.shape)}")
    if rewards_NG.shape[1] < 2:
        raise ValueError(
            f"G = {rewards_NG.shape[1]}: GRPO needs at least 2 completions per group "
            "(the advantage is relative to the group's other samples)"
        )
    centered_NG = rewards_NG - rewards_NG.mean(dim=1, keepdim=True)
    constant_N1 = (rewards_NG == rewards_NG[:, :1]).all(dim=1, keepdim=True)
    centered_NG = torch.where(constant_N1, torch.zeros_like(centered_NG), centered_NG)
    if scale == "none":
        return centered_NG
    if scale == "group":
        std = rewards_NG.std(dim=1, keepdim=True, correction=1)
    else:
        std = rewards_NG.std(correction=1) if rewards_NG.numel() > 1 else rewards_NG.new_zeros(())
    return centered_NG / (std + eps)


def importance_weights(
    old_logp_BT: torch.Tensor,
    behavior_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    level: TISLevel = "token",
    mode: TISMode = "truncate",
    cap: float = 2.0,
    cap_min: float | None = None,
) -> torch.Tensor:
    """The detached truncated-importance-sampling weight `[B, T]`; 0 at padding."""
    _choose("level", level, ("token", "sequence"))
    _choose("mode", mode, ("truncate", "mask"))
    mask = mask_BT.bool()
    with torch.no_grad():
        zero = torch.zeros((), dtype=old_logp_BT.dtype, device=old_logp_BT.device)
        diff_BT = torch.where(mask, old_logp_BT.detach() - behavior_logp_BT.detach(), zero)
        if level == "token":
            log_rho = diff_BT
        else:
            log_rho = diff_BT.sum(dim=1, keepdim=True).expand_as(diff_BT)
        rho = torch.exp(log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        low = cap_min if cap_min is not None else 0.0
        if mode == "truncate":
            w = rho.clamp(min=low, max=cap)
        else:
            w = torch.where((rho >= low) & (rho <= cap), rho, zero)
        return torch.where(mask, w, zero)


def kl_penalty(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, kind: KLKind) -> torch.Tensor:
    """Per-token KL estimate of the policy to the reference (k1, k2 or k3)."""
    _choose("kind", kind, ("k1", "k2", "k3"))
    if kind == "k1":
        return logp_BT - ref_logp_BT
    if kind == "k2":
        return 0.5 * (logp_BT - ref_logp_BT) ** 2
    x = (ref_logp_BT - logp_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(x) - x - 1).clamp(-K3_CLAMP, K3_CLAMP)


def aggregate(
    values_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: AggMode,
    *,
    norm_const: float | None = None,
    global_tokens: int | float | None = None,
    global_seqs: int | float | None = None,
) -> torch.Tensor:
    """Reduce per-token values to a scalar (module docstring: every mode's formula).

    `global_tokens` replaces Σmask (token-mean); `global_seqs` replaces the number of non-empty
    rows (seq-* modes). Given those of the whole batch, micro-batch results sum to the batch's.
    """
    _choose("mode", mode, AGG_MODES)
    mask = mask_BT.bool()
    v = torch.where(mask, values_BT, torch.zeros((), dtype=values_BT.dtype, device=values_BT.device))
    if mode == "token-sum":
        return v.sum()
    if mode == "token-mean":
        denom = global_tokens if global_tokens is not None else mask.sum()
        return v.sum() / max(float(denom), 1.0)
    row_tokens_B = mask.sum(dim=1)
    nonempty_B = row_tokens_B > 0
    seqs = global_seqs if global_seqs is not None else nonempty_B.sum()
    seqs = max(float(seqs), 1.0)
    row_sum_B = v.sum(dim=1)
    if mode == "seq-mean-token-mean":
        row_mean_B = row_sum_B / row_tokens_B.clamp(min=1)
        return row_mean_B.sum() / seqs
    if mode == "seq-mean-token-sum":
        return row_sum_B.sum() / seqs
    if norm_const is None or not norm_const > 0:
        raise ValueError("seq-mean-token-sum-norm needs norm_const > 0 (e.g. max_new_tokens)")
    return row_sum_B.sum() / (seqs * norm_const)


def _as_tis(tis: TISConfig | tuple[str, str, float, float | None] | None) -> TISConfig | None:
    if tis is None or isinstance(tis, TISConfig):
        return tis
    level, mode, cap, cap_min = tis
    return TISConfig(level, mode, cap, cap_min)  # type: ignore[arg-type]


def policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    behavior_logp_BT: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    tis: TISConfig | tuple[str, str, float, float | None] | None = TISConfig(),  # noqa: B008
    agg: AggMode = "token-mean",
    norm_const: float | None = None,
    ref_logp_BT: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    kl: KLKind = "k3",
    global_tokens: int | float | None = None,
    global_seqs: int | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The TIS-corrected clipped GRPO loss of one (micro-)batch, and its metrics."""
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    ref_BT = ref_logp_BT if ref_logp_BT is not None else ref_logp
    if beta > 0 and ref_BT is None:
        raise ValueError("beta > 0 needs ref_logp")
    mask = mask_BT.bool()
    zero = torch.zeros((), dtype=logp_BT.dtype, device=logp_BT.device)
    logp = torch.where(mask, logp_BT, zero)
    old = torch.where(mask, old_logp_BT.detach(), zero)
    behavior = torch.where(mask, behavior_logp_BT.detach(), zero)
    adv_BT = advantages_B.detach().to(logp.dtype).unsqueeze(1).expand_as(logp)
    adv_BT = torch.where(mask, adv_BT, zero)

    ratio = torch.exp((logp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high)
    per_token = torch.maximum(-adv_BT * ratio, -adv_BT * clipped)
    if dual_clip is not None:
        per_token = torch.where(adv_BT < 0, torch.minimum(per_token, -dual_clip * adv_BT), per_token)
    cfg = _as_tis(tis)
    if cfg is None:
        w = mask.to(logp.dtype)
    else:
        w = importance_weights(
            old, behavior, mask, level=cfg.level, mode=cfg.mode, cap=cfg.cap, cap_min=cfg.cap_min
        )
    kw = dict(norm_const=norm_const, global_tokens=global_tokens, global_seqs=global_seqs)
    loss = aggregate(w * per_token, mask, agg, **kw)  # type: ignore[arg-type]
    kl_BT = None
    if ref_BT is not None:
        ref = torch.where(mask, ref_BT.detach(), zero)
        kl_BT = kl_penalty(logp, ref, kl)
        if beta > 0:
            loss = loss + beta * aggregate(kl_BT, mask, agg, **kw)  # type: ignore[arg-type]
    metrics = _metrics(ratio, adv_BT, w, old, behavior, mask, kl_BT, cfg, clip_low, clip_high)
    return loss, metrics


@torch.no_grad()
def _metrics(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    w: torch.Tensor,
    old: torch.Tensor,
    behavior: torch.Tensor,
    mask: torch.Tensor,
    kl_BT: torch.Tensor | None,
    tis: TISConfig | None,
    clip_low: float,
    clip_high: float,
) -> dict[str, float]:
    """Means over valid tokens (0 when there are none; never NaN)."""
    n = int(mask.sum())
    out = dict.fromkeys(METRIC_KEYS, 0.0)
    out["num_tokens"] = float(n)
    if n == 0:
        out["ratio_min"] = out["ratio_max"] = 1.0
        return out
    r, a, wv = ratio[mask], adv[mask], w[mask]
    gap = (old - behavior)[mask]
    out["clip_frac_low"] = float(((r < 1 - clip_low) & (a < 0)).float().mean())
    out["clip_frac_high"] = float(((r > 1 + clip_high) & (a > 0)).float().mean())
    out["tis_weight_mean"] = float(wv.mean())
    out["tis_weight_sum"] = float(wv.sum())
    out["tis_weight_sq_sum"] = float((wv * wv).sum())
    if tis is not None:
        log_rho = gap if tis.level == "token" else wv.new_zeros(0)
        if tis.level == "sequence":
            rows = torch.where(mask, old - behavior, torch.zeros_like(old)).sum(1, keepdim=True)
            log_rho = rows.expand_as(old)[mask]
        rho = torch.exp(log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        low = tis.cap_min if tis.cap_min is not None else 0.0
        out["tis_frac_truncated"] = float(((rho > tis.cap) | (rho < low)).float().mean())
    out["behavior_gap_abs_mean"] = float(gap.abs().mean())
    out["behavior_gap_abs_max"] = float(gap.abs().max())
    x = (-gap).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # k3 of learner vs behaviour
    out["kl_behavior"] = float((torch.exp(x) - x - 1).mean())
    out["ratio_min"] = float(r.min())
    out["ratio_max"] = float(r.max())
    if kl_BT is not None:
        out["kl_ref"] = float(kl_BT[mask].mean())
    return out
