"""The algorithm: how groups are sampled, how the learner steps, the loss, the staleness bound,
and the sharded learner's settings.

Invariants kept by the checks (besides per-field ranges):
- `staleness.publish_every <= staleness.max_staleness + 1`: otherwise no snapshot recent enough
  to start a lease would ever exist and producers would starve.
- truncated sampling (`sampling.top_p < 1`, `top_k > 0`, `min_p > 0`) keeps `top_k <=
  sampling.max_kept`: every sampled token's kept set travels whole to the learner, which
  renormalises its log-probs over it (common/sampling/kept_set.py, docs/sampling.md).
- `sampling.group_size >= 2`: a group of one has no variance to learn from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from common.config.fields import (
    AdvBaseline,
    AdvScale,
    AggMode,
    KLKind,
    LRSchedule,
    Objective,
    RatioLevel,
    ReduceDtype,
    TISLevel,
    TISMode,
    _f,
    _meta,
    failed,
)
from common.sampling.kept_set import MAX_KEPT_WIRE, Truncation

MAX_KEPT_LIMIT = MAX_KEPT_WIRE  # the wire carries a kept set's size in one byte per token


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """`[sampling]`: how producers sample a group (the learner uses the same temperature)."""

    group_size: int = _f(8, "G: completions sampled per prompt.")
    temperature: float = _f(
        1.0, "Sampling temperature; the learner divides logits by the same value."
    )
    top_p: float = _f(
        1.0,
        "Top-p (nucleus): keep a token iff the probability of the tokens more likely than it is "
        "< top_p (1 = off). Importance ratios use each token's kept set (docs/sampling.md).",
    )
    top_k: int = _f(0, "Top-k: keep the k most likely tokens, ties at the k-th kept (0 = off).")
    min_p: float = _f(
        0.0, "Min-p: drop tokens less likely than min_p times the most likely one (0 = off)."
    )
    max_kept: int = _f(
        256,
        "With top_p, top_k or min_p on, the sampler also keeps at most this many tokens per step "
        "(top_k <= max_kept, at most 256), so each token's kept set travels whole to the learner.",
    )
    max_new_tokens: int = _f(16, "Maximum completion length in tokens.")
    max_prompt_tokens: int = _f(1024, "Longer prompts are refused by the consumer.")

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        return failed(
            (
                self.group_size >= 2,
                f"sampling.group_size = {self.group_size}: GRPO needs G >= 2 "
                "(advantages are relative within a group)",
            ),
            (
                math.isfinite(self.temperature) and self.temperature > 0,  # the wire refuses others
                "sampling.temperature must be finite and > 0 "
                "(log-probs are of logits / temperature)",
            ),
            (
                0 < self.top_p <= 1,  # NaN fails too
                f"sampling.top_p = {self.top_p} must be in (0, 1] (1 = off)",
            ),
            (self.top_k >= 0, f"sampling.top_k = {self.top_k} must be >= 0 (0 = off)"),
            (
                0 <= self.min_p < 1,
                f"sampling.min_p = {self.min_p} must be in [0, 1) (0 = off)",
            ),
            (
                1 <= self.max_kept <= MAX_KEPT_LIMIT,
                f"sampling.max_kept = {self.max_kept} must be in [1, {MAX_KEPT_LIMIT}] (each "
                "token carries its kept set's size in one byte)",
            ),
            (
                self.top_k <= self.max_kept,
                f"sampling.top_k = {self.top_k} > sampling.max_kept = {self.max_kept}: every "
                "kept set travels whole to the learner; raise max_kept or lower top_k",
            ),
            (self.max_new_tokens >= 1, "sampling.max_new_tokens must be >= 1"),
        )

    @property
    def truncation(self) -> Truncation:
        """The run's truncation (`active` False with top_p 1, top_k 0, min_p 0)."""
        return Truncation(self.top_k, self.top_p, self.min_p, self.max_kept)


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """`[train]`: one optimizer step: batch, optimizer, memory budgets, checkpoints."""

    prompts_per_step: int = _f(
        8, "Groups (prompts) per optimizer step; B = prompts_per_step * G rows."
    )
    lr: float = _f(1e-5, "AdamW peak learning rate (after warm-up, before decay).")
    lr_schedule: LRSchedule = _f(
        "constant",
        "Learning rate after warm-up: constant, or decaying (linear, cosine) from lr to "
        "lr * lr_min_ratio over the rest of run.steps (consumer/train/schedule.py).",
    )
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata=_meta("AdamW betas."))
    warmup_steps: int = _f(
        0,
        "Optimizer updates of linear warm-up from lr / warmup_steps to lr (0 = none); one "
        "update per learner step unless train.updates_per_batch > 1.",
    )
    lr_min_ratio: float = _f(
        0.0, "The floor of a decaying lr_schedule, as a fraction of lr (in [0, 1])."
    )
    grad_clip: float = _f(1.0, "Global gradient-norm clip (0 = off).")
    micro_batch_tokens: int = _f(
        16384,
        "Token budget of one forward/backward micro-batch: real tokens when rows are packed, "
        "rows x longest row when padded.",
    )
    logprob_chunk_mib: float = _f(
        256.0,
        "The LM head runs on as many completion positions at a time as have float32 logits of "
        "this size (MiB); the log-prob/entropy part peaks at a few times this.",
    )
    updates_per_batch: int = _f(
        1, "Optimizer steps per batch (1 = old_logp is logp.detach(), no extra forward)."
    )
    drop_zero_variance: bool = _f(
        True, "Skip groups whose rewards are all equal (they carry no signal)."
    )
    checkpoint_every: int = _f(0, "Steps between checkpoints (0 = only at shutdown).")
    simulate_step_s: float = _f(
        0.0, "Stress testing only: replace the model step by sleeping this long."
    )

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        return failed(
            (self.prompts_per_step >= 1, "train.prompts_per_step must be >= 1"),
            (self.lr > 0, "train.lr must be > 0"),
            (self.warmup_steps >= 0, "train.warmup_steps must be >= 0"),
            (0 <= self.lr_min_ratio <= 1, "train.lr_min_ratio must be in [0, 1]"),
            (self.micro_batch_tokens >= 1, "train.micro_batch_tokens must be >= 1"),
            (
                math.isfinite(self.logprob_chunk_mib) and self.logprob_chunk_mib > 0,
                "train.logprob_chunk_mib must be > 0",
            ),
            (self.updates_per_batch >= 1, "train.updates_per_batch must be >= 1"),
            (
                len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
                "train.betas must be two numbers in [0, 1)",
            ),
        )


@dataclass(frozen=True, slots=True)
class LossConfig:
    """`[loss]`: advantages, the objective and its clipping, the TIS correction, aggregation, KL.

    The variants and how they combine: docs/loss.md. A combination that has no meaning is
    refused by `problems()` with the reason (the loss's own `LossOptions` checks the same)."""

    adv_baseline: AdvBaseline = _f(
        "group",
        "Advantage baseline: group (r - group mean, GRPO), leave-one-out (r - mean of the other "
        "G - 1, RLOO), group-whiten (r - group mean, then whitened over the batch's tokens: "
        "REINFORCE++-baseline; needs adv_scale = 'none'), batch-whiten (r whitened over the "
        "batch's tokens: REINFORCE++; needs adv_scale = 'none').",
    )
    adv_scale: AdvScale = _f("group", "Advantage std scaling.")
    adv_eps: float = _f(1e-6, "eps in (r - mean) / (std + eps).")
    objective: Objective = _f(
        "ppo",
        "Policy objective: ppo (clipped surrogate), gmpo (geometric mean of the row's token "
        "ratios, each clipped in log space to [-clip_low, clip_high]), cispo (the clipped "
        "ratio as a detached weight on every token's log-prob: no token loses its gradient).",
    )
    ratio_level: RatioLevel = _f(
        "token",
        "The ratio the objective clips: token, or sequence = GSPO's geometric mean of the row's "
        "token ratios (TRL importance_sampling_level = 'sequence', verl loss_mode 'gspo').",
    )
    clip_low: float = _f(
        0.2, "PPO clip: ratio >= 1 - clip_low (gmpo: log-ratio >= -clip_low; cispo: 1 = no floor)."
    )
    clip_high: float = _f(0.2, "PPO clip: ratio <= 1 + clip_high (gmpo: log-ratio <= clip_high).")
    dual_clip: float = _f(0.0, "Dual-clip constant c > 1 for negative advantages (0 = off).")
    tis: bool = _f(True, "Truncated importance sampling correction of behaviour != learner.")
    tis_level: TISLevel = _f("token", "TIS ratio per token or per sequence.")
    tis_mode: TISMode = _f("truncate", "Clamp weights to the cap, or zero tokens outside.")
    tis_cap: float = _f(2.0, "C: upper cap of the TIS weight.")
    tis_cap_min: float = _f(0.0, "Lower cap of the TIS weight (0 = none).")
    agg: AggMode = _f("token-mean", "Loss aggregation.")
    norm_const: float = _f(0.0, "Constant for seq-mean-token-sum-norm (0 = max_new_tokens).")
    beta: float = _f(0.0, "KL penalty weight to the reference (initial) policy.")
    kl: KLKind = _f("k3", "KL estimator.")
    overlong_window: int = _f(
        0,
        "DAPO's soft overlong punishment: a completion longer than sampling.max_new_tokens - "
        "overlong_window tokens loses up to overlong_penalty of reward, linearly (0 = off).",
    )
    overlong_penalty: float = _f(1.0, "The reward lost at sampling.max_new_tokens tokens.")

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        low_ok, low_range = {
            "ppo": (0 <= self.clip_low < 1, "[0, 1)"),
            "cispo": (0 <= self.clip_low <= 1, "[0, 1] (1 = no floor) for objective 'cispo'"),
            "gmpo": (0 <= self.clip_low < math.inf, "[0, inf) (a log-ratio) for objective 'gmpo'"),
        }[self.objective]
        return failed(
            (
                low_ok and self.clip_high >= 0,
                f"loss.clip_low must be in {low_range} and loss.clip_high >= 0",
            ),
            (self.dual_clip == 0 or self.dual_clip > 1, "loss.dual_clip must be 0 (off) or > 1"),
            (
                self.dual_clip == 0 or self.objective == "ppo",
                f"loss.dual_clip bounds PPO's clipped surrogate; objective {self.objective!r} "
                "has none (set dual_clip = 0)",
            ),
            (
                not (self.objective == "gmpo" and self.ratio_level == "sequence"),
                "loss.objective = 'gmpo' clips each token's ratio inside the geometric mean; "
                "clipping the sequence's geometric mean is GSPO (objective = 'ppo', "
                "ratio_level = 'sequence')",
            ),
            (
                self.adv_baseline in ("group", "leave-one-out") or self.adv_scale == "none",
                f"loss.adv_baseline = {self.adv_baseline!r} divides by the batch's std itself: "
                "set loss.adv_scale = 'none'",
            ),
            (
                self.tis_cap > 0 and 0 <= self.tis_cap_min < self.tis_cap,
                "loss.tis_cap must be > 0 and > loss.tis_cap_min >= 0",
            ),
            (self.beta >= 0, "loss.beta must be >= 0"),
            (self.overlong_window >= 0, "loss.overlong_window must be >= 0 (0 = off)"),
            (
                math.isfinite(self.overlong_penalty) and self.overlong_penalty >= 0,
                "loss.overlong_penalty must be finite and >= 0",
            ),
        )


@dataclass(frozen=True, slots=True)
class StalenessConfig:
    """`[staleness]`: the off-policy bound and how often weights are published."""

    max_staleness: int = _f(
        2, "Largest learner_version - behavior_version trained (0 = synchronous on-policy)."
    )
    publish_every: int = _f(1, "Steps between weight snapshots (<= max_staleness + 1).")

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        return failed(
            (
                self.max_staleness >= 0,
                "staleness.max_staleness must be >= 0 (0 = synchronous on-policy)",
            ),
            (self.publish_every >= 1, "staleness.publish_every must be >= 1"),
            (
                self.publish_every <= self.max_staleness + 1,
                f"staleness.publish_every = {self.publish_every} > "
                f"max_staleness + 1 = {self.max_staleness + 1}: "
                "producers could never load weights recent enough to start a lease; "
                "lower publish_every or raise max_staleness",
            ),
        )


@dataclass(frozen=True, slots=True)
class DistConfig:
    """`[dist]`: the sharded learner under torchrun (FSDP2)."""

    timeout_s: float = _f(
        300.0,
        "Sharded learner (torchrun, world size > 1): a collective that waits longer than this "
        "means another rank died or hangs, and the learner stops with an error.",
    )
    reshard_after_forward: bool = _f(
        True,
        "FSDP2: free each decoder layer's gathered parameters after its forward and gather them "
        "again in backward (less memory, more communication).",
    )
    reduce_dtype: ReduceDtype = _f(
        "float32",
        "FSDP2: dtype gradients are reduced in across ranks when model.dtype = bfloat16 (CUDA).",
    )

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        return failed((self.timeout_s > 0, "dist.timeout_s must be > 0"))
