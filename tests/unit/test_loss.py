"""consumer/train/loss.py against hand-worked numbers and reference loops written from the formulas.

Float64 on CPU. The reference functions below use plain Python floats and loops over the valid
tokens of each row, independently of the tensor code; conformance is checked to rtol 1e-6.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from common import config as C
from consumer.train import advantages as ADV
from consumer.train import loss as L
from consumer.train.options import loss_options

LOG = math.log
OPTION_NAMES = {f.name for f in dataclasses.fields(L.LossOptions)}


def policy_loss(logp, old, behavior, adv, mask, **kw):
    """`L.policy_loss` with its `LossOptions` given as keywords, as the tables below write them
    (`tis` as a `(level, mode, cap, cap_min)` tuple, the reference loops' form)."""
    options = {k: kw.pop(k) for k in list(kw) if k in OPTION_NAMES}
    if isinstance(options.get("tis"), tuple) and len(options["tis"]) == 4:
        options["tis"] = L.TISConfig(*options["tis"])
    return L.policy_loss(logp, old, behavior, adv, mask, L.LossOptions(**options), **kw)


# ---------------------------------------------------------------------------------------------
# Reference implementations (loops over valid tokens; padding is never read)


def ref_group_advantages(rewards: list[list[float]], scale: str, eps: float) -> list[list[float]]:
    flat = [r for group in rewards for r in group]
    flat_mean = sum(flat) / len(flat)
    batch_std = math.sqrt(sum((r - flat_mean) ** 2 for r in flat) / (len(flat) - 1))
    out = []
    for group in rewards:
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
        denom = {"group": std + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        constant = all(r == group[0] for r in group)
        out.append([0.0 if constant else (r - mean) / denom for r in group])
    return out


def ref_weights(gaps: list[float], tis: tuple[str, str, float, float | None] | None) -> list[float]:
    """TIS weights of one row's valid tokens from their old - behavior gaps."""
    if tis is None:
        return [1.0] * len(gaps)
    level, mode, cap, cap_min = tis
    low = 0.0 if cap_min is None else cap_min
    clamp20 = lambda x: min(max(x, -20.0), 20.0)  # noqa: E731
    if level == "token":
        rhos = [math.exp(clamp20(g)) for g in gaps]
    else:
        rhos = [math.exp(clamp20(sum(gaps)))] * len(gaps)
    if mode == "truncate":
        return [min(max(rho, low), cap) for rho in rhos]
    return [rho if low <= rho <= cap else 0.0 for rho in rhos]


def ref_kl(logp: float, ref: float, kind: str) -> float:
    if kind == "k1":
        return logp - ref
    if kind == "k2":
        return 0.5 * (logp - ref) ** 2
    x = min(max(ref - logp, -20.0), 20.0)
    return min(max(math.exp(x) - x - 1, -10.0), 10.0)


def ref_aggregate(rows, mode, norm_const=None, global_tokens=None, global_seqs=None) -> float:
    """`rows`: per row, the list of its valid tokens' values."""
    total = sum(sum(row) for row in rows)
    tokens = sum(len(row) for row in rows) if global_tokens is None else global_tokens
    seqs = sum(1 for row in rows if row) if global_seqs is None else global_seqs
    tokens, seqs = max(tokens, 1), max(seqs, 1)
    if mode == "token-mean":
        return total / tokens
    if mode == "token-sum":
        return total
    if mode == "seq-mean-token-mean":
        return sum(sum(row) / len(row) for row in rows if row) / seqs
    if mode == "seq-mean-token-sum":
        return total / seqs
    return total / (seqs * norm_const)


def ref_policy_loss(batch, *, clip_low, clip_high, dual_clip, tis, agg, beta, kl, norm_const=None):
    pg_rows, kl_rows = [], []
    for b in range(len(batch["adv"])):
        valid = [t for t in range(batch["mask"].shape[1]) if batch["mask"][b, t]]
        logp = [float(batch["logp"][b, t]) for t in valid]
        old = [float(batch["old"][b, t]) for t in valid]
        gaps = [o - float(batch["behavior"][b, t]) for o, t in zip(old, valid, strict=True)]
        weights = ref_weights(gaps, tis)
        a = float(batch["adv"][b])
        row = []
        for lp, o, w in zip(logp, old, weights, strict=True):
            r = math.exp(min(max(lp - o, -20.0), 20.0))
            loss = max(-a * r, -a * min(max(r, 1 - clip_low), 1 + clip_high))
            if dual_clip is not None and a < 0:
                loss = min(loss, -dual_clip * a)
            row.append(w * loss)
        pg_rows.append(row)
        refs = [float(batch["ref"][b, t]) for t in valid]
        kl_rows.append([ref_kl(lp, rf, kl) for lp, rf in zip(logp, refs, strict=True)])
    total = ref_aggregate(pg_rows, agg, norm_const)
    return total + beta * ref_aggregate(kl_rows, agg, norm_const)


def make_batch(seed: int, B: int = 5, T: int = 7, pad: float = math.nan) -> dict[str, torch.Tensor]:
    """A random float64 batch; arbitrary mask patterns (a prompt prefix, gaps, an empty row)."""
    rng = np.random.default_rng(seed)
    mask = rng.random((B, T)) < 0.7
    mask[0] = False  # one empty row
    mask[1, :3] = False  # a prompt prefix
    old = -rng.gamma(1.0, 1.0, (B, T))
    batch = {
        "logp": old + rng.normal(0, 0.4, (B, T)),
        "old": old,
        "behavior": old + rng.normal(0, 0.6, (B, T)),
        "ref": old + rng.normal(0, 0.5, (B, T)),
        "adv": rng.normal(0, 1, B),
    }
    out = {
        k: torch.from_numpy(np.where(mask, v, pad) if v.ndim == 2 else v) for k, v in batch.items()
    }
    out["adv"][0] = pad  # the empty row's advantage may be anything too
    out["mask"] = torch.from_numpy(mask)
    return out


def run_loss(batch, **kw):
    return policy_loss(
        batch["logp"], batch["old"], batch["behavior"], batch["adv"], batch["mask"], **kw
    )


# ---------------------------------------------------------------------------------------------
# Advantages


def test_classic_four_rewards_give_plus_minus_0866_with_bessels_std():
    adv = ADV.group_advantages(torch.tensor([[1.0, 0.0, 1.0, 0.0]], dtype=torch.float64))
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # 0.866
    assert adv[0].tolist() == pytest.approx([expected, -expected, expected, -expected], rel=1e-12)
    assert adv[0, 0].item() == pytest.approx(0.866, abs=5e-4)


def test_six_of_ten_rewards_show_the_sample_std_convention():
    rewards = torch.tensor([[1.0] * 6 + [0.0] * 4], dtype=torch.float64)
    adv = ADV.group_advantages(rewards, eps=0.0)
    std_ddof1 = math.sqrt((6 * 0.4**2 + 4 * 0.6**2) / 9)  # 0.5164, not sqrt(0.24) = 0.4899
    assert adv[0, 0].item() == pytest.approx(0.4 / std_ddof1, rel=1e-12)  # 0.7746
    assert adv[0, -1].item() == pytest.approx(-0.6 / std_ddof1, rel=1e-12)  # -1.1619
    assert adv[0, 0].item() == pytest.approx(0.7746, abs=1e-4)
    assert adv[0, 0].item() != pytest.approx(0.8165, abs=1e-3)  # what ddof=0 would give


def test_eps_is_added_outside_the_square_root():
    adv = ADV.group_advantages(torch.tensor([[1.0, 0.0]], dtype=torch.float64), eps=0.5)
    assert adv[0, 0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 0.5), rel=1e-12)


def test_batch_scale_uses_group_means_and_the_std_of_all_rewards():
    rewards = torch.tensor([[1.0, 0.0], [3.0, 3.0]], dtype=torch.float64)
    adv = ADV.group_advantages(rewards, scale="batch", eps=0.0)
    assert adv.flatten().tolist() == pytest.approx([1 / 3, -1 / 3, 0.0, 0.0], rel=1e-12)  # std 1.5


def test_scale_none_only_centres_each_group():
    adv = ADV.group_advantages(
        torch.tensor([[1.0, 0.0, 1.0, 0.0], [2.0, 4.0, 6.0, 8.0]]), scale="none"
    )
    assert adv.tolist() == [[0.5, -0.5, 0.5, -0.5], [-3.0, -1.0, 1.0, 3.0]]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_zero_variance_group_gets_exactly_zero_advantage(scale, eps):
    rewards = torch.tensor([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7], [1.0, 0.0, 0.5]], dtype=torch.float64)
    adv = ADV.group_advantages(rewards, scale=scale, eps=eps)
    assert (adv[:2] == 0).all()
    assert (adv[2] != 0).any()
    assert ADV.group_advantages(rewards[:2], scale=scale, eps=eps).eq(0).all()  # all-constant batch


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_match_the_reference_loops_in_float64(scale):
    rewards = np.random.default_rng(0).normal(size=(4, 6)).round(1)
    adv = ADV.group_advantages(torch.from_numpy(rewards), scale=scale)
    assert adv.dtype == torch.float64
    expected = ref_group_advantages(rewards.tolist(), scale, 1e-6)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-6, atol=1e-12)


def test_advantages_are_at_least_float32():
    assert ADV.group_advantages(torch.tensor([[1, 0]])).dtype == torch.float32
    assert ADV.group_advantages(torch.tensor([[1, 0]], dtype=torch.bfloat16)).dtype == torch.float32


@pytest.mark.parametrize("G", [0, 1])
def test_groups_of_fewer_than_two_completions_are_refused(G):
    with pytest.raises(ValueError, match="at least 2") as info:
        ADV.group_advantages(torch.zeros(3, G))
    assert str(info.value) == (
        f"G = {G}: GRPO needs at least 2 completions per group "
        "(an advantage is relative to the other samples of the same prompt)"
    )


def test_an_empty_batch_gets_empty_advantages_without_a_warning_under_batch_scale():
    # pytest turns warnings into errors: std() of no rewards would warn (and be NaN)
    for scale in ("batch", "none"):
        adv = ADV.group_advantages(torch.zeros(0, 4), scale=scale)  # type: ignore[arg-type]
        assert adv.shape == (0, 4)


def test_rewards_must_be_two_dimensional():
    with pytest.raises(ValueError, match=r"\[n_groups, G\]"):
        ADV.group_advantages(torch.zeros(4))


# ---------------------------------------------------------------------------------------------
# Importance weights

GAPS = [LOG(3.0), LOG(0.5), 0.0]  # row sum log 1.5


@pytest.mark.parametrize(
    ("level", "mode", "cap", "cap_min", "expected"),
    [
        ("token", "truncate", 2.0, None, [2.0, 0.5, 1.0]),
        ("token", "truncate", 2.0, 0.8, [2.0, 0.8, 1.0]),
        ("token", "mask", 2.0, None, [0.0, 0.5, 1.0]),
        ("token", "mask", 2.0, 0.8, [0.0, 0.0, 1.0]),
        ("sequence", "truncate", 2.0, None, [1.5, 1.5, 1.5]),
        ("sequence", "truncate", 1.2, None, [1.2, 1.2, 1.2]),
        ("sequence", "truncate", 2.0, 1.6, [1.6, 1.6, 1.6]),
        ("sequence", "mask", 2.0, None, [1.5, 1.5, 1.5]),
        ("sequence", "mask", 1.2, None, [0.0, 0.0, 0.0]),
        ("sequence", "mask", 2.0, 1.6, [0.0, 0.0, 0.0]),
    ],
)
def test_importance_weights_by_level_and_mode(level, mode, cap, cap_min, expected):
    old = torch.tensor([[g - 1.0 for g in GAPS] + [math.nan]], dtype=torch.float64)
    behavior = torch.tensor([[-1.0, -1.0, -1.0, math.inf]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    w = L.importance_weights(old, behavior, mask, level=level, mode=mode, cap=cap, cap_min=cap_min)
    assert w[0].tolist() == pytest.approx([*expected, 0.0], rel=1e-12)
    assert w[0, :3].tolist() == pytest.approx(ref_weights(GAPS, (level, mode, cap, cap_min)))


@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_a_ratio_exactly_at_either_cap_keeps_its_weight(level, mode):
    """The caps are inclusive: rho == cap and rho == cap_min keep w = rho, also when masking."""
    gaps = torch.tensor([[0.75], [-0.5], [0.75 + 1e-9], [-0.5 - 1e-9]], dtype=torch.float64)
    cap, cap_min = math.exp(0.75), math.exp(-0.5)
    assert torch.exp(gaps[:2, 0]).tolist() == [cap, cap_min]  # exactly, as the weight sees it
    if level == "sequence":  # the same log-ratios as row sums of two tokens each
        gaps = torch.cat([gaps - 0.25, torch.full_like(gaps, 0.25)], dim=1)
    w = L.importance_weights(
        gaps, torch.zeros_like(gaps), torch.ones_like(gaps, dtype=torch.bool),
        level=level, mode=mode, cap=cap, cap_min=cap_min,
    )  # fmt: skip
    beyond = [cap, cap_min] if mode == "truncate" else [0.0, 0.0]
    assert w[:, 0].tolist() == [cap, cap_min, *beyond]
    assert w.eq(w[:, :1]).all()


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_log_ratios_are_clamped_to_20_before_exp(level):
    old = torch.tensor([[50.0], [-50.0]], dtype=torch.float64)
    w = L.importance_weights(old, torch.zeros_like(old), torch.ones(2, 1), level=level, cap=1e12)
    assert w[:, 0].tolist() == pytest.approx([math.exp(20), math.exp(-20)], rel=1e-12)


def test_sequence_weight_is_the_product_of_the_row_token_ratios():
    rng = np.random.default_rng(1)
    old, behavior = (torch.from_numpy(rng.normal(-1, 0.1, (3, 4))) for _ in range(2))
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1], [0, 0, 0, 0]])
    w = L.importance_weights(old, behavior, mask, level="sequence", cap=100.0)
    token = L.importance_weights(old, behavior, mask, level="token", cap=100.0)
    for b in range(2):
        product = math.prod(token[b, t].item() for t in range(4) if mask[b, t])
        assert w[b][mask[b].bool()].tolist() == pytest.approx([product] * int(mask[b].sum()))
    assert w[2].eq(0).all()


def test_importance_weights_are_detached():
    old = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    w = L.importance_weights(old, torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, 3))
    assert not w.requires_grad


def test_cap_min_may_equal_cap_or_zero():
    assert L.TISConfig(cap=2.0, cap_min=2.0).cap_min == 2.0  # keeps only rho == cap (mask)
    assert L.TISConfig(cap=2.0, cap_min=0.0).cap_min == 0.0


@pytest.mark.parametrize("kwargs", [{"cap": 0.0}, {"cap": 2.0, "cap_min": 3.0}, {"cap_min": -0.1}])
def test_bad_tis_caps_are_refused(kwargs):
    with pytest.raises(ValueError, match="cap"):
        L.importance_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), **kwargs)


# ---------------------------------------------------------------------------------------------
# KL penalty


@pytest.mark.parametrize(
    ("logp", "ref", "kind", "expected"),
    [
        (-1.0, -1.5, "k1", 0.5),
        (-1.5, -1.0, "k1", -0.5),
        (-1.0, -1.5, "k2", 0.125),
        (-1.5, -1.0, "k2", 0.125),
        (-1.0, -1.5, "k3", math.exp(-0.5) + 0.5 - 1),
        (-1.0, 1.0, "k3", math.exp(2.0) - 3.0),
        (-40.0, -5.0, "k3", 10.0),  # x = 35 -> 20, exp(20) - 21 -> clamp 10
        (-5.0, -40.0, "k3", 10.0),  # x = -35 -> -20, exp(-20) + 19 -> clamp 10
        (-13.0, -10.0, "k3", 10.0),  # x = 3 needs no clamp, but k3 = e³ - 4 = 16.1 -> 10
        (-2.0, -2.0, "k3", 0.0),
    ],
)
def test_kl_estimators_and_their_clamps(logp, ref, kind, expected):
    value = L.kl_penalty(torch.tensor([logp], dtype=torch.float64), torch.tensor([ref]), kind)
    assert value.item() == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert value.item() == pytest.approx(ref_kl(logp, ref, kind), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_k1_and_k3_are_unbiased_for_kl_on_the_policys_samples(kind):
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    expectation = (p * L.kl_penalty(p.log(), q.log(), kind)).sum().item()
    assert expectation == pytest.approx((p * (p / q).log()).sum().item(), rel=1e-12)


# ---------------------------------------------------------------------------------------------
# Aggregation

VALUES = torch.tensor([[1.0, 2.0, math.nan], [3.0, math.nan, math.inf], [math.nan] * 3])
VALID = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        ("token-mean", {}, 6 / 3),
        ("token-mean", {"global_tokens": 6}, 1.0),
        ("token-sum", {}, 6.0),
        ("token-sum", {"global_tokens": 6, "global_seqs": 6}, 6.0),
        ("seq-mean-token-mean", {}, (1.5 + 3.0) / 2),
        ("seq-mean-token-mean", {"global_seqs": 3}, (1.5 + 3.0) / 3),
        ("seq-mean-token-sum", {}, 6 / 2),
        ("seq-mean-token-sum", {"global_seqs": 4}, 6 / 4),
        ("seq-mean-token-sum-norm", {"norm_const": 4}, 6 / (2 * 4)),
        ("seq-mean-token-sum-norm", {"norm_const": 4, "global_seqs": 3}, 6 / (3 * 4)),
    ],
)
def test_every_aggregation_mode_by_hand(mode, kwargs, expected):
    assert L.aggregate(VALUES, VALID, mode, **kwargs).item() == pytest.approx(expected, rel=1e-6)
    rows = [[1.0, 2.0], [3.0], []]
    assert ref_aggregate(rows, mode, **kwargs) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("mode", L.AGG_MODES)
def test_an_empty_batch_aggregates_to_zero_not_nan(mode):
    out = L.aggregate(VALUES, torch.zeros_like(VALID), mode, norm_const=8)
    assert out.item() == 0.0


@pytest.mark.parametrize("norm_const", [None, 0.0])
def test_seq_mean_token_sum_norm_needs_norm_const(norm_const):
    with pytest.raises(ValueError, match="norm_const"):
        L.aggregate(VALUES, VALID, "seq-mean-token-sum-norm", norm_const=norm_const)


# ---------------------------------------------------------------------------------------------
# Policy loss: hand-worked tokens, TIS, KL, reference conformance


@pytest.mark.parametrize(
    ("adv", "ratio", "dual_clip", "expected_loss", "expected_grad"),
    [
        (1.0, 1.5, None, -1.2, 0.0),  # clipped above: no gradient
        (1.0, 0.5, None, -0.5, -0.5),  # pessimistic branch is the unclipped one
        (-1.0, 0.5, None, 0.8, 0.0),  # clipped below
        (-1.0, 1.5, None, 1.5, 1.5),
        (-1.0, 2.0, 3.0, 2.0, 2.0),  # under the dual bound
        (-1.0, 5.0, 3.0, 3.0, 0.0),  # dual clip: -c·A
        (2.0, 1.0, None, -2.0, -2.0),
        (1.0, 1.25, None, -1.2, 0.0),
    ],
)
def test_clipped_surrogate_of_one_token_by_hand(
    adv, ratio, dual_clip, expected_loss, expected_grad
):
    logp = torch.tensor([[LOG(ratio) - 1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0]], dtype=torch.float64)
    loss, _ = policy_loss(
        logp, old, old, torch.tensor([adv]), torch.ones(1, 1), dual_clip=dual_clip
    )
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12)
    assert logp.grad.item() == pytest.approx(expected_grad, rel=1e-12, abs=1e-15)  # -A·r or 0


def test_clip_higher_widens_only_the_upper_bound():
    logp, old = torch.tensor([[LOG(1.25)]], dtype=torch.float64), torch.zeros(1, 1)
    loss, _ = policy_loss(logp, old, old, torch.tensor([1.0]), torch.ones(1, 1), clip_high=0.28)
    assert loss.item() == pytest.approx(-1.25, rel=1e-12)


def test_tis_weight_multiplies_the_policy_term_but_not_the_kl_term():
    logp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    behavior = logp - LOG(4.0)  # rho = 4 -> w = 2
    ref = logp - 0.5
    common = {"ref_logp": ref, "beta": 0.1, "kl": "k1"}
    loss, m = policy_loss(logp, logp, behavior, torch.tensor([1.0]), torch.ones(1, 2), **common)
    assert loss.item() == pytest.approx(2 * -1.0 + 0.1 * 0.5, rel=1e-12)
    assert m["kl_ref"] == pytest.approx(0.5)
    loss0, _ = policy_loss(logp, logp, behavior, torch.tensor([0.0]), torch.ones(1, 2), **common)
    assert loss0.item() == pytest.approx(0.05, rel=1e-12)  # A = 0: only the unweighted KL


def test_tis_none_means_unit_weights_and_a_tisconfig_selects_the_weight():
    batch = make_batch(2)
    options = L.LossOptions(tis=L.TISConfig("sequence", "mask", 3.0, 0.1))
    as_config, _ = L.policy_loss(
        batch["logp"], batch["old"], batch["behavior"], batch["adv"], batch["mask"], options
    )
    reference = ref_policy_loss(
        batch, clip_low=0.2, clip_high=0.2, dual_clip=None, tis=("sequence", "mask", 3.0, 0.1),
        agg="token-mean", beta=0.0, kl="k3",
    )  # fmt: skip
    assert as_config.item() == pytest.approx(reference, rel=1e-6)
    off, m = run_loss(batch, tis=None)
    default, _ = run_loss(batch)
    assert m["tis_weight_mean"] == 1.0
    assert off.item() != default.item()


TIS_SPECS = [
    None,
    ("token", "truncate", 2.0, None),
    ("token", "mask", 2.0, 0.5),
    ("sequence", "truncate", 1.5, 0.7),
    ("sequence", "mask", 5.0, None),
]


@pytest.mark.parametrize("tis", TIS_SPECS)
@pytest.mark.parametrize("agg", L.AGG_MODES)
def test_policy_loss_matches_the_reference_loops_in_float64(agg, tis):
    batch = make_batch(3)
    options = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0, "tis": tis, "agg": agg}
    options |= {"beta": 0.05, "kl": "k3", "norm_const": 9.0}
    loss, _ = run_loss(batch, ref_logp=batch["ref"], **options)
    assert loss.dtype == torch.float64
    assert loss.item() == pytest.approx(ref_policy_loss(batch, **options), rel=1e-6)


@given(
    seed=st.integers(0, 2**32 - 1),
    agg=st.sampled_from(L.AGG_MODES),
    tis=st.sampled_from(TIS_SPECS),
    kl=st.sampled_from(L.KL_KINDS),
    dual_clip=st.sampled_from([None, 1.5, 3.0]),
    clips=st.tuples(st.floats(0.0, 0.9), st.floats(0.0, 2.0)),
    beta=st.sampled_from([0.0, 0.01, 1.0]),
)
@settings(max_examples=40, deadline=None)
def test_policy_loss_matches_the_reference_for_any_options(
    seed, agg, tis, kl, dual_clip, clips, beta
):
    batch = make_batch(seed, B=4, T=5)
    options = {"clip_low": clips[0], "clip_high": clips[1], "dual_clip": dual_clip, "tis": tis}
    options |= {"agg": agg, "beta": beta, "kl": kl, "norm_const": 7.0}
    loss, metrics = run_loss(batch, ref_logp=batch["ref"], **options)
    assert loss.item() == pytest.approx(ref_policy_loss(batch, **options), rel=1e-6, abs=1e-12)
    assert all(math.isfinite(v) for v in metrics.values())


# ---------------------------------------------------------------------------------------------
# Gradients


@pytest.mark.parametrize(("agg", "tis"), list(zip(L.AGG_MODES, TIS_SPECS, strict=True)))
def test_gradient_matches_finite_differences_in_float64(agg, tis):
    batch = make_batch(4, B=4, T=5)
    logp = batch["logp"].clone().requires_grad_(True)

    def f(lp: torch.Tensor) -> torch.Tensor:
        return policy_loss(
            lp,
            batch["old"],
            batch["behavior"],
            batch["adv"],
            batch["mask"],
            tis=tis,
            agg=agg,
            dual_clip=2.0,
            ref_logp=batch["ref"],
            beta=0.1,
            norm_const=5.0,
        )[0]

    assert torch.autograd.gradcheck(f, (logp,), eps=1e-6, atol=1e-7)


def test_tis_weight_and_behaviour_log_probs_receive_no_gradient():
    batch = make_batch(5)
    logp, old, behavior, ref = (
        batch[k].clone().requires_grad_(True) for k in ("logp", "old", "behavior", "ref")
    )
    adv = batch["adv"].clone().requires_grad_(True)
    loss, _ = policy_loss(
        logp,
        old,
        behavior,
        adv,
        batch["mask"],
        tis=("sequence", "truncate", 2.0, None),
        ref_logp=ref,
        beta=0.1,
    )
    loss.backward()
    assert old.grad is None
    assert behavior.grad is None
    assert ref.grad is None
    assert adv.grad is None
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[~batch["mask"]].eq(0).all()


def test_the_gradient_treats_the_tis_weight_as_a_constant():
    batch = make_batch(6)
    valid = batch["mask"]
    logp = batch["logp"].clone().requires_grad_(True)
    old = torch.where(valid, batch["logp"], 0.0)  # on-policy: ratio 1, gradient -A·w / n
    loss, _ = policy_loss(logp, old, batch["behavior"], batch["adv"], valid)
    loss.backward()
    w = L.importance_weights(old, batch["behavior"], valid)
    adv = torch.where(valid, batch["adv"][:, None], 0.0)
    expected = torch.where(valid, -adv * w / valid.sum(), 0.0)
    torch.testing.assert_close(logp.grad, expected, rtol=1e-12, atol=1e-15)


def test_old_logp_equal_to_detached_logp_gives_ratio_one():
    batch = make_batch(7)
    _, m = run_loss({**batch, "old": batch["logp"].detach()})
    assert m["ratio_min"] == m["ratio_max"] == 1.0
    assert m["clip_frac_low"] == m["clip_frac_high"] == 0.0


# ---------------------------------------------------------------------------------------------
# Metrics


def test_metrics_by_hand_over_valid_tokens_only():
    nan = math.nan
    old = torch.tensor([[-1.0, -1.0, nan], [-1.0, -1.0, nan]], dtype=torch.float64)
    logp = old + torch.tensor([[LOG(1.5), 0, 0], [LOG(0.5), LOG(4.0), 0]], dtype=torch.float64)
    behavior = old - torch.tensor([[LOG(3.0), 0, 0], [LOG(0.5), 0, 0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    _, m = policy_loss(logp, old, behavior, torch.tensor([1.0, -1.0]), mask, dual_clip=3.0)
    k3 = lambda x: math.exp(x) - x - 1  # noqa: E731
    expected = {
        "clip_frac_low": 0.25,
        "clip_frac_high": 0.25,
        "clip_frac_dual": 0.25,
        "ratio_min": 0.5,
        "ratio_max": 4.0,
        "tis_weight_mean": (2.0 + 1.0 + 0.5 + 1.0) / 4,
        "tis_weight_sum": 4.5,
        "tis_weight_sq_sum": 4.0 + 1.0 + 0.25 + 1.0,
        "tis_frac_truncated": 0.25,
        "behavior_gap_abs_mean": (LOG(3.0) + LOG(2.0)) / 4,
        "behavior_gap_abs_max": LOG(3.0),
        "kl_behavior": (k3(LOG(3.0)) + k3(LOG(0.5))) / 4,
        "ratio_out_of_band": 0.5,  # old/behaviour ratios 3, 1, 0.5, 1
        "kl_ref": 0.0,
        "num_tokens": 4.0,
    }
    assert list(m) == list(L.METRIC_KEYS)
    assert m == pytest.approx(expected, rel=1e-12)
    assert all(type(v) is float for v in m.values())


def test_an_empty_micro_batch_reports_zero_metrics_and_a_zero_loss():
    batch = make_batch(8)
    batch["mask"] = torch.zeros_like(batch["mask"])
    logp = batch["logp"].clone().requires_grad_(True)
    loss, m = run_loss({**batch, "logp": logp}, ref_logp=batch["ref"], beta=0.1)
    loss.backward()
    assert loss.item() == 0.0
    assert logp.grad.eq(0).all()
    assert m == dict.fromkeys(L.METRIC_KEYS, 0.0)
    _, m0 = run_loss({k: v[:0] for k, v in batch.items()})
    assert m0 == dict.fromkeys(L.METRIC_KEYS, 0.0)


def test_kl_to_the_reference_is_measured_but_not_added_when_beta_is_zero():
    batch = make_batch(9)
    with_ref, m = run_loss(batch, ref_logp=batch["ref"], kl="k2")
    without, m0 = run_loss(batch)
    assert with_ref.item() == without.item()
    assert m["kl_ref"] > 0
    assert m0["kl_ref"] == 0.0


# ---------------------------------------------------------------------------------------------
# The old-logp rule


@pytest.mark.parametrize(("updates", "needed"), [(1, False), (2, True), (4, True)])
def test_old_logp_needs_its_own_pass_only_with_several_updates_per_batch(updates, needed):
    assert L.needs_old_logp_pass(updates) is needed


def test_updates_per_batch_must_be_positive():
    with pytest.raises(ValueError, match="updates_per_batch"):
        L.needs_old_logp_pass(0)


# ---------------------------------------------------------------------------------------------
# Refused inputs

ONE = torch.zeros(1, 2)
CALLS = {
    "scale": lambda: ADV.group_advantages(torch.zeros(1, 2), scale="std"),
    "tis level": lambda: L.importance_weights(ONE, ONE, ONE > -1, level="row"),
    "tis mode": lambda: L.importance_weights(ONE, ONE, ONE > -1, mode="clip"),
    "kl": lambda: L.kl_penalty(ONE, ONE, "k4"),
    "agg": lambda: L.aggregate(ONE, ONE > -1, "mean"),
    "policy agg": lambda: policy_loss(ONE, ONE, ONE, ONE[:, 0], ONE > -1, agg="seq-mean"),
    "policy kl": lambda: policy_loss(ONE, ONE, ONE, ONE[:, 0], ONE > -1, kl="low_var_kl"),
    "policy tis": lambda: policy_loss(
        ONE, ONE, ONE, ONE[:, 0], ONE > -1, tis=("tok", "truncate", 2.0, None)
    ),
}


@pytest.mark.parametrize("name", CALLS)
def test_bad_mode_strings_are_refused_with_the_allowed_values(name):
    option = {"policy tis": "tis level"}.get(name, name.removeprefix("policy "))
    with pytest.raises(ValueError, match=f"^{option} must be one of '"):  # names the option
        CALLS[name]()


def test_a_refused_mode_lists_every_allowed_value_and_what_it_got():
    with pytest.raises(ValueError, match="scale") as info:
        ADV.group_advantages(torch.zeros(1, 2), scale="std")  # type: ignore[arg-type]
    assert str(info.value) == "scale must be one of 'group', 'batch', 'none'; got 'std'"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clip_low": 1.0}, "clip_low"),
        ({"clip_high": -0.1}, "clip_high"),
        ({"dual_clip": 1.0}, "dual_clip"),
        ({"beta": -1.0}, "beta"),
        ({"beta": 0.1}, "needs ref_logp"),
        ({"tis": ("token", "mask", 2.0)}, "tis must be"),
        ({"agg": "seq-mean-token-sum-norm"}, "needs norm_const"),
    ],
)
def test_bad_policy_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_loss(make_batch(0), **kwargs)


@pytest.mark.parametrize("name", ["logp", "old", "behavior", "mask", "ref"])
def test_every_per_token_input_must_have_the_batch_shape(name):
    batch = {**make_batch(0), "ref": make_batch(0)["old"]}
    batch[name] = batch[name][:, :-1]
    with pytest.raises(ValueError) as info:  # noqa: PT011 (the whole message is checked)
        run_loss(batch, ref_logp=batch.pop("ref"))
    shapes = [(5, 7)] * 5
    shapes[["logp", "old", "behavior", "mask", "ref"].index(name)] = (5, 6)
    assert str(info.value) == (
        "logp, old_logp, behavior_logp, mask (and ref_logp) must share one [B, T] shape; "
        f"got {shapes}"
    )


def test_advantages_of_the_wrong_length_are_refused_with_both_shapes():
    batch = make_batch(0)
    with pytest.raises(ValueError) as info:  # noqa: PT011 (the whole message is checked)
        run_loss({**batch, "adv": batch["adv"][:-1]})
    assert str(info.value) == "advantages must be one value per row, [B] = (5,); got (4,)"


def test_beta_without_a_reference_is_refused_with_the_reason():
    with pytest.raises(ValueError) as info:  # noqa: PT011 (the whole message is checked)
        run_loss(make_batch(0), beta=0.1)
    assert str(info.value) == "beta > 0 needs ref_logp"


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_the_policy_ratio_is_clamped_to_exp_20_before_it_multiplies(adv):
    logp = torch.tensor([[50.0, -50.0]], dtype=torch.float64)
    old = torch.zeros_like(logp)
    loss, m = policy_loss(
        logp, old, old, torch.tensor([adv], dtype=torch.float64), torch.ones_like(logp).bool(),
        tis=None, agg="token-sum",
    )  # fmt: skip
    assert (m["ratio_min"], m["ratio_max"]) == (math.exp(-20), math.exp(20))
    # A > 0: max(-r, -clip(r)) per token; A < 0: max(r, clip(r))
    r = [math.exp(20), math.exp(-20)]
    expected = (-1.2 - r[1]) if adv > 0 else (r[0] + 0.8)
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_the_loss_has_the_dtype_of_the_log_probs_whatever_the_advantages_are():
    batch = {k: v.float() if k != "mask" else v for k, v in make_batch(1).items()}
    loss, _ = run_loss({**batch, "adv": batch["adv"].double()})
    assert loss.dtype == torch.float32


def test_with_beta_zero_the_measured_kl_never_touches_the_loss_or_its_gradient():
    batch = make_batch(2)
    ref = torch.where(batch["mask"], torch.tensor(-1e300, dtype=torch.float64), math.nan)
    logp = batch["logp"].clone().requires_grad_(True)
    loss, m = run_loss({**batch, "logp": logp}, ref_logp=ref, kl="k2")  # k2 = inf here
    loss.backward()
    assert m["kl_ref"] == math.inf
    reference, _ = run_loss(batch)
    assert loss.item() == reference.item()
    assert torch.isfinite(logp.grad).all()


def test_k3_keeps_a_finite_gradient_at_any_log_ratio():
    logp = torch.tensor([-1000.0, -30.0, 0.0, 30.0, 1000.0], dtype=torch.float64)
    logp.requires_grad_(True)
    k3 = L.kl_penalty(logp, torch.zeros_like(logp), "k3")
    k3.sum().backward()
    assert torch.isfinite(k3).all()
    assert torch.isfinite(logp.grad).all()
    assert k3.tolist() == [10.0, 10.0, 0.0, 10.0, 10.0]  # the clamp at 10 acts on both sides


def test_mismatched_shapes_are_refused():
    batch = make_batch(0)
    with pytest.raises(ValueError, match="share one"):
        run_loss({**batch, "old": batch["old"][:, :-1]})
    with pytest.raises(ValueError, match="one value per row"):
        run_loss({**batch, "adv": batch["adv"][:-1]})


@pytest.mark.parametrize("norm_const", [None, 0.0, -1.0])
def test_dr_grpo_aggregation_without_a_positive_constant_is_refused_at_once(norm_const):
    with pytest.raises(ValueError) as info:  # noqa: PT011 (the whole message is checked)
        L.LossOptions(agg="seq-mean-token-sum-norm", norm_const=norm_const)  # no loss computed
    assert str(info.value) == "agg 'seq-mean-token-sum-norm' needs norm_const > 0"
    with pytest.raises(ValueError) as info:  # noqa: PT011
        L.aggregate(ONE, ONE > -1, "seq-mean-token-sum-norm", norm_const=norm_const)
    assert str(info.value) == (
        "agg 'seq-mean-token-sum-norm' needs norm_const > 0 (e.g. max_new_tokens)"
    )


def test_any_positive_norm_const_is_accepted_even_below_one():
    assert L.LossOptions(agg="seq-mean-token-sum-norm", norm_const=0.5).norm_const == 0.5
    values = torch.tensor([[1.0, 2.0]])
    got = L.aggregate(values, values > 0, "seq-mean-token-sum-norm", norm_const=0.5)
    assert got.item() == 6.0  # (1 + 2) / (1 row * 0.5)


def test_every_mode_the_config_accepts_builds_loss_options():
    for agg in C.choices(C.AggMode):
        for kl in C.choices(C.KLKind):
            for level in C.choices(C.TISLevel):
                for mode in C.choices(C.TISMode):
                    values = {"loss.agg": agg, "loss.kl": kl, "loss.tis_level": level}
                    cfg = C.override(C.Config(), {**values, "loss.tis_mode": mode})
                    options = loss_options(cfg)
                    assert (options.agg, options.kl) == (agg, kl)
                    assert options.tis == L.TISConfig(level, mode, 2.0, None)
    off = loss_options(C.override(C.Config(), {"loss.tis": False, "loss.dual_clip": 0.0}))
    assert off.tis is None
    assert off.dual_clip is None
    assert off.norm_const == C.Config().sampling.max_new_tokens  # 0 = max_new_tokens
