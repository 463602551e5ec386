"""The seeded cases on which the loss variants are compared with the libraries that define them.

Inputs come from numpy's PCG64 generator (`numpy.random.default_rng(seed)`, a stream numpy keeps
stable across releases), so the fixture script (make_fixtures.py, which calls TRL and verl) and
the test (tests/unit/test_loss_references.py, which calls only this project) build the same
tensors from a case's seed; fixtures.json holds the references' outputs only.

A case is a dict: `id`, `ref` (which reference function), `seed`, and the reference's own
settings; `ours(case)` says which of this project's options reproduce them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

CASES_PER_REFERENCE = 24
# Rows with no trained token appear in these references' inputs (a mean over sequences then
# divides by all rows in TRL's "grpo" and verl's geo_mean: `global_seqs` = B, see `ours`).
POLICY_REFERENCES = ("trl_gspo", "trl_cispo", "verl_gspo", "verl_gmpo", "verl_cispo")
ADVANTAGE_REFERENCES = ("verl_grpo", "verl_rloo", "verl_rfpp_baseline", "verl_rfpp")
TIS_CAP = 2.0


def policy_inputs(seed: int, *, empty_row: bool) -> dict[str, torch.Tensor]:
    """float64 [B, T] log-probs (learner, old, behaviour, reference), the mask (rows of unequal
    length at unequal offsets, some with holes) and [B] advantages (some exactly 0)."""
    rng = np.random.default_rng(seed)
    B, T = int(rng.integers(2, 7)), int(rng.integers(3, 11))
    lengths = rng.integers(1, T + 1, B)
    if empty_row:
        lengths[int(rng.integers(B))] = 0
    mask = np.zeros((B, T), bool)
    for b, n in enumerate(lengths):
        start = int(rng.integers(0, T - n + 1))
        mask[b, start : start + n] = True
        if n > 2 and rng.random() < 0.4:  # a hole: a token whose kept set was unknown
            mask[b, start + int(rng.integers(1, n - 1))] = False
    logp = -rng.exponential(1.0, (B, T))
    old = logp + rng.normal(0.0, 0.15, (B, T))
    behavior = old + rng.normal(0.0, 0.3, (B, T))
    ref = logp + rng.normal(0.0, 0.2, (B, T))
    adv = rng.normal(0.0, 1.0, B)
    adv[rng.random(B) < 0.15] = 0.0
    t = {"logp": logp, "old": old, "behavior": behavior, "ref": ref, "adv": adv}
    out = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in t.items()}
    out["mask"] = torch.from_numpy(mask)
    return out


def advantage_inputs(seed: int, *, prefix: bool) -> dict[str, torch.Tensor]:
    """float64 [N, G] rewards (0/1 with constant groups, or continuous) and int64 [N, G] trained
    tokens (0 allowed unless `prefix`: REINFORCE++ puts the reward on the last token)."""
    rng = np.random.default_rng(seed)
    N, G = int(rng.integers(2, 6)), int(rng.integers(2, 9))
    if rng.random() < 0.5:
        rewards = (rng.random((N, G)) < 0.5).astype(np.float64)
        rewards[0] = rewards[0, 0]  # a constant group
    else:
        rewards = rng.normal(0.5, 1.0, (N, G))
    tokens = rng.integers(1 if prefix else 0, 9, (N, G))
    return {"rewards": torch.from_numpy(rewards), "tokens": torch.from_numpy(tokens)}


def token_rewards(rewards_NG: torch.Tensor, tokens_NG: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """verl's layout: [B, T] rewards (each on its row's last token; position 0 of an empty row),
    the [B, T] prefix response mask, and [B] group ids."""
    B, T = rewards_NG.numel(), max(int(tokens_NG.max()), 1)
    mask = torch.arange(T)[None, :] < tokens_NG.reshape(-1, 1)
    scores = torch.zeros(B, T, dtype=torch.float64)
    last = (tokens_NG.reshape(-1) - 1).clamp(min=0)
    scores[torch.arange(B), last] = rewards_NG.reshape(-1)
    index = np.repeat(np.arange(rewards_NG.shape[0]), rewards_NG.shape[1])
    return scores, mask.to(torch.float64), torch.from_numpy(index)


def tis_weights(
    old: torch.Tensor, behavior: torch.Tensor, mask: torch.Tensor, level: str
) -> torch.Tensor:
    """Truncated IS weights written from the formula (TRL's vLLM correction, `token_truncate` or
    `sequence_truncate`, cap 2), handed to the references as their per-token weights."""
    diff = torch.where(mask, old - behavior, 0.0)
    if level == "sequence":
        diff = diff.sum(1, keepdim=True).expand_as(diff)
    return torch.where(mask, torch.exp(diff).clamp(max=TIS_CAP), 0.0)


def _pick(rng: np.random.Generator, values: list[Any]) -> Any:
    return values[int(rng.integers(len(values)))]


def all_cases() -> list[dict[str, Any]]:
    """Every case, CASES_PER_REFERENCE per reference; the settings drawn from the case's seed."""
    cases = []
    for r, ref in enumerate(POLICY_REFERENCES + ADVANTAGE_REFERENCES):
        for i in range(CASES_PER_REFERENCE):
            seed = 1000 * (r + 1) + i
            rng = np.random.default_rng([seed, 7])
            case: dict[str, Any] = {"id": f"{ref}-{i:02d}", "ref": ref, "seed": seed}
            if ref in POLICY_REFERENCES:
                case["empty_row"] = bool(i % 4 == 3)
                case["tis"] = _pick(rng, [None, "token", "sequence"])
            if ref == "trl_gspo" and case["tis"] == "token":
                # TRL weighs a row's token gradients by the row's mean TIS weight, GSPO-token
                # (verl, and this project) each by its own: they agree when w is one per row
                case["tis"] = "sequence"
            if ref == "trl_gspo":
                case["loss_type"] = ["grpo", "bnpo", "dr_grpo", "dapo"][i % 4]
                case["clip"] = _pick(rng, [(3e-4, 4e-4), (0.2, 0.28), (0.05, 0.05)])
                case["beta"] = _pick(rng, [0.0, 0.04])
            elif ref == "trl_cispo":
                case["level"] = ["token", "sequence"][i % 2]
                case["epsilon_high"] = _pick(rng, [5.0, 2.0, 1.25])
                case["beta"] = _pick(rng, [0.0, 0.04])
            elif ref == "verl_gspo":
                case["clip"] = _pick(rng, [(3e-4, 4e-4), (0.2, 0.28), (0.05, 0.05)])
            elif ref == "verl_gmpo":
                case["clip"] = _pick(rng, [(0.4, 0.4), (0.2, 0.28), (0.05, 0.1)])
            elif ref == "verl_cispo":
                case["clip"] = _pick(rng, [(0.2, 0.28), (0.5, 4.0), (0.05, 0.05)])
                case["agg"] = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"][i % 3]
            elif ref == "verl_grpo":
                case["norm_by_std"] = bool(i % 2)
            cases.append(case)
    return cases


def ours(case: dict[str, Any], inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """This project's `LossOptions` fields and `policy_loss` keywords for a policy case."""
    B, T = inputs["mask"].shape
    ref = case["ref"]
    tis = None if case["tis"] is None else ("truncate", case["tis"])
    opts: dict[str, Any] = {"tis": tis, "kl": "k3", "beta": case.get("beta", 0.0)}
    kw: dict[str, Any] = {}
    if ref == "trl_gspo":
        opts.update(objective="ppo", ratio_level="sequence")
        opts["clip_low"], opts["clip_high"] = case["clip"]
        agg = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean"}
        opts["agg"] = agg.get(case["loss_type"], "seq-mean-token-sum-norm")
        if case["loss_type"] == "dr_grpo":  # TRL: Σ / (B · max_completion_length)
            opts["norm_const"] = float(T)
        kw["global_seqs"] = float(B)  # TRL means over all rows, empty ones too
    elif ref == "trl_cispo":
        opts.update(objective="cispo", ratio_level=case["level"], agg="token-mean")
        opts["clip_low"], opts["clip_high"] = 1.0, case["epsilon_high"] - 1.0
    elif ref == "verl_gspo":
        opts.update(objective="ppo", ratio_level="sequence", agg="seq-mean-token-mean")
        opts["clip_low"], opts["clip_high"] = case["clip"]
    elif ref == "verl_gmpo":
        opts.update(objective="gmpo", agg="seq-mean-token-mean")
        opts["clip_low"], opts["clip_high"] = case["clip"]
        kw["global_seqs"] = float(B)  # verl: torch.mean over all rows
    elif ref == "verl_cispo":
        opts.update(objective="cispo", agg=case["agg"])
        opts["clip_low"], opts["clip_high"] = case["clip"]
    return {"options": opts, "kwargs": kw}
