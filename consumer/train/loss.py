"""The GRPO loss family as pure tensor functions: log-probs and advantages in, a scalar loss out.

Owns: the truncated-importance-sampling (TIS) weight, the three objectives (PPO-clip at token or
sequence level = GSPO, GMPO, CISPO), the KL penalty, aggregation and the loss metrics. Does not:
compute advantages (consumer/train/advantages.py), run models, read config objects, move
tensors between devices, or do I/O (consumer/train/trainer.py does). The sampling-distribution
log-prob rule lives in common/sampling/logprobs.py. docs/loss.md lists the formulas.

Shapes: N groups, G per group, B = N·G rows, T token positions. Names carry their shape
(`logp_BT`, `mask_BT`, `advantages_B`). Log-prob roles: `logp` (learner, with gradient),
`old_logp` (learner before this update), `behavior_logp` (the weights that sampled),
`ref_logp` (reference policy of the KL penalty). `mask_BT` is 1 at trained tokens.

Formulas (GRPO, Shao et al. 2024; DAPO clip-higher, Yu et al. 2025; dual clip, Ye et al. 2020;
GSPO, Zheng et al. 2025; GMPO, Zhao et al. 2025; CISPO, MiniMax-M1 2025; TIS, Yao et al. 2025;
IcePop / MIS; k3, Schulman 2020):
- TIS weight (detached): token level log_rho_t = old_t - behavior_t; sequence level
  log_rho_b = Σ_t mask·(old_t - behavior_t), broadcast over the row; rho = exp(clamp(log_rho, ±20)).
    "truncate": w = clamp(rho, cap_min, cap);  "mask": w = rho·1[cap_min <= rho <= cap].
  w = 0 at padding; cap_min None means no lower bound.
- The ratio, d_t = logp_t - old_t: token level r_t = exp(clamp(d_t, ±20)); sequence level
  (GSPO-token) r_t = exp(clamp(logp_t - sg(logp_t) + sg(mean_t d_t), ±20)): in value the row's
  geometric-mean ratio s_b, with the gradient of the token's own log-prob.
- "ppo": L_t = max(-A·r, -A·clip(r, 1 - clip_low, 1 + clip_high)); dual clip c > 1 where A < 0:
  L = min(L, -c·A); then L = w·L. A is one value per row, broadcast over its tokens.
- "cispo": L_t = -w·sg(clip(r, 1 - clip_low, 1 + clip_high))·A·logp_t (clip_low = 1: no floor).
- "gmpo" (token ratios only): per row, with σ = sign(A) and d̂_t = σ·min(σ·d_t, σ·clip(d_t,
  -clip_low, clip_high)): L_b = -w̄_b·A·exp(clamp(mean_t d̂_t, ±20)), w̄_b = exp(mean_t log w_t)
  the geometric mean of the row's TIS weights; L_b is placed at each of the row's tokens.
- KL to the reference (never IS-weighted): k1 = logp - ref; k2 = ½(logp - ref)²;
  k3 = clamp(exp(x) - x - 1, ±10) with x = clamp(ref - logp, ±20) (verl's low_var_kl).
- loss = aggregate(L) + beta·aggregate(kl), the same mode and normalisers for both terms.
- Aggregation: see `aggregate` (token-mean, token-sum, seq-mean-token-mean, seq-mean-token-sum,
  seq-mean-token-sum-norm).

Invariants: padding positions may hold anything (NaN, ±inf) in any input; every input passes
through `torch.where(mask, x, 0)` before any arithmetic, so neither values nor gradients see
them. Gradients flow only through `logp`. With global normalisers, the losses of micro-batches
add up to the loss of the whole batch, so accumulated gradients are exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import get_args

import torch

from common.config import AggMode, KLKind, Objective, RatioLevel, TISLevel, TISMode

# The modes are declared once, in common/config/ (the config keys that select them).
TIS_LEVELS: tuple[str, ...] = get_args(TISLevel)
TIS_MODES: tuple[str, ...] = get_args(TISMode)
KL_KINDS: tuple[str, ...] = get_args(KLKind)
AGG_MODES: tuple[str, ...] = get_args(AggMode)
RATIO_LEVELS: tuple[str, ...] = get_args(RatioLevel)
OBJECTIVES: tuple[str, ...] = get_args(Objective)

LOG_RATIO_CLAMP = 20.0  # |log-ratio| bound before exp (token ratios, TIS, k3)
RATIO_BAND = (0.9, 1.1)  # `ratio_out_of_band`: the old/behaviour ratios outside it (a metric)
K3_CLAMP = 10.0  # |k3| bound

# The fixed set of metric keys `policy_loss` returns (all floats, always present). Means are over
# valid tokens; across micro-batches combine `*_sum` and `num_tokens` by adding, `*_min` / `*_max`
# by min / max, everything else as a token-weighted mean. An empty micro-batch reports all zeros.
METRIC_KEYS = (
    "clip_frac_low",  # A < 0 and r < 1 - clip_low (gradient clipped away)
    "clip_frac_high",  # A > 0 and r > 1 + clip_high
    "clip_frac_dual",  # A < 0 and r > dual_clip (0 without dual clip)
    "ratio_min",  # min r = exp(logp - old_logp)
    "ratio_max",  # max r
    "tis_weight_mean",  # mean w (1 without TIS)
    "tis_weight_sum",  # Σ w, for the effective sample size (Σw)² / (n·Σw²)
    "tis_weight_sq_sum",  # Σ w²
    "tis_frac_truncated",  # fraction of tokens whose weight was truncated or masked (w != rho)
    "behavior_gap_abs_mean",  # mean |old_logp - behavior_logp|
    "behavior_gap_abs_max",  # max |old_logp - behavior_logp|
    "kl_behavior",  # k3 estimate of KL(behaviour ‖ learner-old) on the behaviour's samples
    "ratio_out_of_band",  # tokens whose exp(old_logp - behavior_logp) is outside RATIO_BAND
    "kl_ref",  # mean per-token KL estimate (`kl` kind) to the reference; 0 without ref_logp
    "num_tokens",  # number of valid tokens
)


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


@dataclass(frozen=True, slots=True)
class TISConfig:
    """Truncated importance sampling options (`LossOptions.tis`; None there means no TIS)."""

    level: TISLevel = "token"
    mode: TISMode = "truncate"
    cap: float = 2.0
    cap_min: float | None = None

    def __post_init__(self) -> None:
        _check_choice("tis level", self.level, TIS_LEVELS)
        _check_choice("tis mode", self.mode, TIS_MODES)
        if not self.cap > 0:
            raise ValueError(f"tis cap must be > 0, got {self.cap}")
        if self.cap_min is not None and not 0 <= self.cap_min <= self.cap:
            raise ValueError(f"tis cap_min must be in [0, cap={self.cap}], got {self.cap_min}")


DEFAULT_TIS = TISConfig()


def needs_old_logp_pass(updates_per_batch: int) -> bool:
    """Whether the trainer must pay a separate no-grad forward pass for `old_logp`.

    With one optimizer step per batch (`updates_per_batch == 1`), the policy before the update is
    the policy of this very forward pass: `old_logp = logp.detach()`, the ratio is exactly 1 in
    value (its gradient is that of logp), and no second forward is paid. With k > 1 updates per
    batch the weights move between them, so `old_logp` must be computed once, before the first
    update, under `torch.no_grad()`, and reused by all k updates.
    """
    if updates_per_batch < 1:
        raise ValueError(f"updates_per_batch must be >= 1, got {updates_per_batch}")
    return updates_per_batch > 1


def _tis_rho(diff_BT: torch.Tensor, level: str) -> torch.Tensor:
    """rho = exp(clamp(log_rho, ±20)) from the sanitised (0 at padding) old - behavior."""
    log_rho_BT = diff_BT if level == "token" else diff_BT.sum(1, keepdim=True).expand_as(diff_BT)
    return torch.exp(log_rho_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _tis_weight(rho_BT: torch.Tensor, mask_BT: torch.Tensor, cfg: TISConfig) -> torch.Tensor:
    low = 0.0 if cfg.cap_min is None else cfg.cap_min
    if cfg.mode == "truncate":
        w_BT = rho_BT.clamp(min=low, max=cfg.cap)
    else:
        w_BT = torch.where((rho_BT >= low) & (rho_BT <= cfg.cap), rho_BT, 0.0)
    return torch.where(mask_BT, w_BT, 0.0)


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
    """The detached TIS weight `[B, T]` (formulas: module docstring); 0 at padding."""
    cfg = TISConfig(level, mode, cap, cap_min)
    mask = mask_BT.bool()
    with torch.no_grad():
        diff_BT = torch.where(mask, old_logp_BT - behavior_logp_BT, 0.0)
        return _tis_weight(_tis_rho(diff_BT, cfg.level), mask, cfg)


def kl_penalty(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, kind: KLKind) -> torch.Tensor:
    """Per-token estimate of KL(policy ‖ reference) on the policy's samples: k1, k2 or k3.

    k3 >= 0 always, so only its upper clamp (10) can act; x's clamp (±20) bounds exp.
    """
    _check_choice("kl", kind, KL_KINDS)
    if kind == "k1":
        return logp_BT - ref_logp_BT
    if kind == "k2":
        return 0.5 * (logp_BT - ref_logp_BT) ** 2
    x_BT = (ref_logp_BT - logp_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(x_BT) - x_BT - 1).clamp(-K3_CLAMP, K3_CLAMP)


def aggregate(
    values_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: AggMode,
    *,
    norm_const: float | None = None,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce per-token values to a scalar over valid tokens (padding values are never read).

    With m = mask, S = number of non-empty rows (rows with at least one valid token):
      token-mean               Σ m·v / Σ m                     Σ m  -> global_tokens
      token-sum                Σ m·v                           (no normaliser)
      seq-mean-token-mean      Σ_b (Σ_t m·v / Σ_t m) / S       S    -> global_seqs
      seq-mean-token-sum       Σ m·v / S                       S    -> global_seqs
      seq-mean-token-sum-norm  Σ m·v / (S · norm_const)        S    -> global_seqs (Dr. GRPO)
    Given `global_tokens` (total valid tokens of the whole batch) or `global_seqs` (its non-empty
    rows), the normaliser is the batch's instead of this micro-batch's, so micro-batch results
    add up exactly to the batch's. The other global is ignored. Denominators below 1 are raised
    to 1: an empty batch gives 0, never NaN.
    """
    _check_choice("agg", mode, AGG_MODES)
    mask = mask_BT.bool()
    v_BT = torch.where(mask, values_BT, 0.0)
    if mode == "token-sum":
        return v_BT.sum()
    if mode == "token-mean":
        if global_tokens is not None:
            return v_BT.sum() / max(float(global_tokens), 1.0)
        return v_BT.sum() / mask.sum().clamp(min=1)
    tokens_B = mask.sum(dim=1)
    seqs = (tokens_B > 0).sum().clamp(min=1) if global_seqs is None else max(global_seqs, 1.0)
    if mode == "seq-mean-token-mean":
        return (v_BT.sum(dim=1) / tokens_B.clamp(min=1)).sum() / seqs
    if mode == "seq-mean-token-sum":
        return v_BT.sum() / seqs
    if norm_const is None or not norm_const > 0:
        raise ValueError("agg 'seq-mean-token-sum-norm' needs norm_const > 0 (e.g. max_new_tokens)")
    return v_BT.sum() / (seqs * norm_const)


def _clipped_surrogate(
    ratio_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> torch.Tensor:
    clipped_BT = ratio_BT.clamp(1 - clip_low, 1 + clip_high)
    loss_BT = torch.maximum(-adv_BT * ratio_BT, -adv_BT * clipped_BT)
    if dual_clip is not None:
        loss_BT = torch.where(adv_BT < 0, torch.minimum(loss_BT, -dual_clip * adv_BT), loss_BT)
    return loss_BT


def _sequence_log_ratio(logp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token's log s_{b,t} = log p_t - sg(log p_t) + sg(mean_t(log p - log old)): the value
    of the row's geometric-mean ratio at every token, the gradient of that token's log-prob."""
    with torch.no_grad():
        mean_B1 = (logp - old).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
    return logp - logp.detach() + mean_B1


def _gmpo(
    logp: torch.Tensor,
    old: torch.Tensor,
    adv_B: torch.Tensor,
    adv_BT: torch.Tensor,
    w_BT: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> torch.Tensor:
    """GMPO's row loss -A·exp(mean_t sgn(A)·min(sgn(A)·d_t, sgn(A)·clip(d_t, -lo, hi))), d =
    log p - log old, times the geometric mean of the row's TIS weights; broadcast over the row."""
    d_BT = logp - old
    sgn_BT = torch.sign(adv_BT)
    d_BT = sgn_BT * torch.minimum(sgn_BT * d_BT, sgn_BT * d_BT.clamp(-clip_low, clip_high))
    n_B = mask.sum(1).clamp(min=1)
    ratio_B = torch.exp((d_BT.sum(1) / n_B).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    with torch.no_grad():  # exp(mean log w); a weight of 0 (masked out) zeroes its row
        w_B = torch.exp(torch.where(mask, torch.log(w_BT), 0.0).sum(1) / n_B)
    row_B = -w_B * adv_B * ratio_B
    return row_B[:, None].expand_as(logp)


@torch.no_grad()
def _clipped_masks(
    ratio_BT: torch.Tensor, adv_BT: torch.Tensor, o: LossOptions
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(low, high, dual): the tokens each objective clips (`clip_frac_*`)."""
    lo, hi = o.clip_low, o.clip_high
    if o.objective == "gmpo":  # log-space bounds on the token ratio
        lo_r, hi_r = math.exp(-lo), math.exp(hi)
        none = torch.zeros_like(adv_BT, dtype=torch.bool)
        return (adv_BT < 0) & (ratio_BT < lo_r), (adv_BT > 0) & (ratio_BT > hi_r), none
    if o.objective == "cispo":  # the weight is clipped, whatever the advantage's sign
        none = torch.zeros_like(adv_BT, dtype=torch.bool)
        return ratio_BT < 1 - lo, ratio_BT > 1 + hi, none
    dual_c = math.inf if o.dual_clip is None else o.dual_clip
    return (
        (adv_BT < 0) & (ratio_BT < 1 - lo),
        (adv_BT > 0) & (ratio_BT > 1 + hi),
        (adv_BT < 0) & (ratio_BT > dual_c),
    )


@dataclass(frozen=True, slots=True)
class LossOptions:
    """Every option of `policy_loss`, checked once at construction. "Off" is None, never 0.

    objective: "ppo" (clipped surrogate), "gmpo" (geometric mean), "cispo" (clipped weight).
    ratio_level: the ratio clipped, "token" or "sequence" (GSPO's geometric mean; not gmpo).
    clip_low, clip_high: the clip range: ppo and cispo [1 - clip_low, 1 + clip_high] on the
    ratio (0 <= clip_low < 1; cispo also 1 = no floor), gmpo [-clip_low, clip_high] on the
    log-ratio; clip_high >= 0.
    dual_clip: c > 1 for negative advantages (ppo only), or None.
    tis: the TIS weight (`TISConfig`), or None for w = 1.
    agg: aggregation mode; norm_const: its constant (> 0) for "seq-mean-token-sum-norm".
    beta: KL penalty weight (>= 0; > 0 needs `ref_logp`); kl: the KL estimator.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    tis: TISConfig | None = DEFAULT_TIS
    agg: AggMode = "token-mean"
    norm_const: float | None = None
    beta: float = 0.0
    kl: KLKind = "k3"
    objective: Objective = "ppo"
    ratio_level: RatioLevel = "token"

    def __post_init__(self) -> None:
        _check_choice("agg", self.agg, AGG_MODES)
        _check_choice("kl", self.kl, KL_KINDS)
        _check_choice("objective", self.objective, OBJECTIVES)
        _check_choice("ratio_level", self.ratio_level, RATIO_LEVELS)
        lo, hi = self.clip_low, self.clip_high
        lo_ok = {"ppo": 0 <= lo < 1, "cispo": 0 <= lo <= 1, "gmpo": 0 <= lo < math.inf}
        if not (lo_ok[self.objective] and hi >= 0):
            lo_range = {"ppo": "< 1", "cispo": "<= 1", "gmpo": "finite"}[self.objective]
            raise ValueError(
                f"need 0 <= clip_low {lo_range} ({self.objective}) and clip_high >= 0, "
                f"got {lo}, {hi}"
            )
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        if self.dual_clip is not None and self.objective != "ppo":
            raise ValueError(f"dual_clip bounds PPO's surrogate; {self.objective!r} has none")
        if self.objective == "gmpo" and self.ratio_level == "sequence":
            raise ValueError("gmpo clips token ratios; a clipped sequence ratio is GSPO (ppo)")
        if not self.beta >= 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.tis is not None and not isinstance(self.tis, TISConfig):
            raise ValueError(f"tis must be None or a TISConfig, got {self.tis!r}")
        if self.agg == "seq-mean-token-sum-norm" and not (self.norm_const or 0) > 0:
            raise ValueError("agg 'seq-mean-token-sum-norm' needs norm_const > 0")


DEFAULT_OPTIONS = LossOptions()


def _check_shapes(advantages_B: torch.Tensor, *per_token_BT: torch.Tensor | None) -> None:
    shapes = [tuple(t.shape) for t in per_token_BT if t is not None]
    if len(set(shapes)) != 1 or len(shapes[0]) != 2:
        raise ValueError(
            "logp, old_logp, behavior_logp, mask (and ref_logp) must share one [B, T] shape; "
            f"got {shapes}"
        )
    if tuple(advantages_B.shape) != shapes[0][:1]:
        raise ValueError(
            f"advantages must be one value per row, [B] = {shapes[0][:1]}; "
            f"got {tuple(advantages_B.shape)}"
        )


def policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    behavior_logp_BT: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_BT: torch.Tensor,
    options: LossOptions = DEFAULT_OPTIONS,
    *,
    ref_logp: torch.Tensor | None = None,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The TIS-corrected GRPO-family loss of one (micro-)batch, and its metrics (`METRIC_KEYS`).

    `options` (built once per run) holds every mode and constant: the objective (ppo, gmpo,
    cispo) and the level of its ratio (token, or sequence = GSPO). `ref_logp` is `[B, T]`;
    required when beta > 0, otherwise only measured (`kl_ref`). `global_tokens` / `global_seqs`
    are the whole batch's normalisers (see `aggregate`). Gradients flow only into `logp`.
    """
    o = options
    _check_shapes(advantages_B, logp_BT, old_logp_BT, behavior_logp_BT, mask_BT, ref_logp)
    if o.beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp")
    cfg = o.tis
    mask = mask_BT.bool()
    logp = torch.where(mask, logp_BT, 0.0)
    old = torch.where(mask, old_logp_BT.detach(), 0.0)
    adv_BT = torch.where(mask, advantages_B.detach().to(logp.dtype)[:, None], 0.0)
    with torch.no_grad():
        gap_BT = old - torch.where(mask, behavior_logp_BT.detach(), 0.0)
        rho_BT = _tis_rho(gap_BT, cfg.level) if cfg is not None else torch.ones_like(gap_BT)
        w_BT = _tis_weight(rho_BT, mask, cfg) if cfg is not None else mask.to(gap_BT.dtype)

    log_ratio_BT = logp - old
    if o.ratio_level == "sequence":
        log_ratio_BT = _sequence_log_ratio(logp, old, mask)
    ratio_BT = torch.exp(log_ratio_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    if o.objective == "gmpo":
        adv_B = torch.where(mask.any(1), advantages_B.detach().to(logp.dtype), 0.0)
        per_token_BT = _gmpo(logp, old, adv_B, adv_BT, w_BT, mask, o.clip_low, o.clip_high)
    elif o.objective == "cispo":
        weight_BT = ratio_BT.detach().clamp(1 - o.clip_low, 1 + o.clip_high)
        per_token_BT = w_BT * (-weight_BT * adv_BT * logp)
    else:
        surr_BT = _clipped_surrogate(ratio_BT, adv_BT, o.clip_low, o.clip_high, o.dual_clip)
        per_token_BT = w_BT * surr_BT
    norms = {"norm_const": o.norm_const, "global_tokens": global_tokens, "global_seqs": global_seqs}
    loss = aggregate(per_token_BT, mask, o.agg, **norms)
    kl_BT = None
    if ref_logp is not None:
        ref = torch.where(mask, ref_logp.detach(), 0.0)
        if o.beta > 0:
            kl_BT = kl_penalty(logp, ref, o.kl)
            loss = loss + o.beta * aggregate(kl_BT, mask, o.agg, **norms)
        else:  # measured only
            kl_BT = kl_penalty(logp.detach(), ref, o.kl)
    clipped = _clipped_masks(ratio_BT, adv_BT, o)
    return loss, _metrics(ratio_BT, clipped, w_BT, rho_BT, gap_BT, mask, kl_BT)


@torch.no_grad()
def _metrics(
    ratio_BT: torch.Tensor,
    clipped: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    w_BT: torch.Tensor,
    rho_BT: torch.Tensor,
    gap_BT: torch.Tensor,
    mask: torch.Tensor,
    kl_BT: torch.Tensor | None,
) -> dict[str, float]:
    """`METRIC_KEYS` over valid tokens, read back with one device sync; zeros when none."""
    if mask.numel() == 0:
        return dict.fromkeys(METRIC_KEYS, 0.0)
    dtype = ratio_BT.dtype
    n = mask.sum().to(dtype)
    any_valid = n > 0

    def mean(x_BT: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, x_BT.to(dtype), 0.0).sum() / n.clamp(min=1)

    def extreme(x_BT: torch.Tensor, largest: bool) -> torch.Tensor:
        fill = -math.inf if largest else math.inf
        x = torch.where(mask, x_BT, fill)
        return torch.where(any_valid, x.amax() if largest else x.amin(), 0.0)

    gap_abs_BT = gap_BT.abs()
    x_BT = gap_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    token_rho = torch.exp(x_BT)  # per token, whatever the TIS level
    values = {
        "clip_frac_low": mean(clipped[0]),
        "clip_frac_high": mean(clipped[1]),
        "clip_frac_dual": mean(clipped[2]),
        "ratio_min": extreme(ratio_BT, largest=False),
        "ratio_max": extreme(ratio_BT, largest=True),
        "tis_weight_mean": mean(w_BT),
        "tis_weight_sum": w_BT.sum(),
        "tis_weight_sq_sum": (w_BT * w_BT).sum(),
        "tis_frac_truncated": mean(w_BT != rho_BT),
        "behavior_gap_abs_mean": mean(gap_abs_BT),
        "behavior_gap_abs_max": extreme(gap_abs_BT, largest=True),
        "kl_behavior": mean(torch.exp(x_BT) - x_BT - 1),
        "ratio_out_of_band": mean((token_rho < RATIO_BAND[0]) | (token_rho > RATIO_BAND[1])),
        "kl_ref": mean(kl_BT) if kl_BT is not None else n * 0,
        "num_tokens": n,
    }
    read = torch.stack([values[k].to(dtype) for k in METRIC_KEYS]).tolist()
    return dict(zip(METRIC_KEYS, read, strict=True))
