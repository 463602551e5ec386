"""The loss variants (GSPO, GMPO, CISPO; RLOO, REINFORCE++; DAPO's overlong punishment) and how
they compose with the rest of the loss: TIS, masks (kept sets), aggregations, KL, micro-batches.

Float64 on CPU. What they equal in TRL and verl: tests/unit/test_loss_references.py.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from common import config as C
from common import wire
from consumer.train import advantages as ADV
from consumer.train import loss as L
from consumer.train.batch_advantages import batch_advantages
from consumer.train.options import advantage_options, loss_options

VARIANTS = [  # (objective, ratio_level, clip_low, clip_high)
    ("ppo", "token", 0.2, 0.28),
    ("ppo", "sequence", 0.05, 0.05),
    ("gmpo", "token", 0.4, 0.4),
    ("cispo", "token", 1.0, 0.28),
    ("cispo", "sequence", 0.2, 0.28),
]
TIS = [None, L.TISConfig("token"), L.TISConfig("sequence", "mask", 2.0, 0.5)]
AGGS = L.AGG_MODES


def inputs(seed: int = 0, B: int = 6, T: int = 7) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    mask[1, 0] = False  # a hole: a token whose kept set was unknown
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    old = logp + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    behavior = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = logp + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return {"logp": logp, "old": old, "behavior": behavior, "ref": ref, "adv": adv, "mask": mask}


def options(variant, tis=None, agg="token-mean", beta=0.0) -> L.LossOptions:
    objective, level, lo, hi = variant
    return L.LossOptions(
        clip_low=lo,
        clip_high=hi,
        objective=objective,
        ratio_level=level,
        tis=tis,
        agg=agg,
        norm_const=8.0,
        beta=beta,
    )


def loss_and_grad(x, o, rows=None, **kw):
    rows = list(range(len(x["adv"]))) if rows is None else rows
    logp = x["logp"][rows].clone().requires_grad_(True)
    loss, metrics = L.policy_loss(
        logp,
        x["old"][rows],
        x["behavior"][rows],
        x["adv"][rows],
        x["mask"][rows],
        o,
        ref_logp=x["ref"][rows],
        **kw,
    )
    loss.backward()
    return loss.detach(), logp.grad, metrics


@pytest.mark.parametrize(
    ("variant", "tis", "agg"), list(itertools.product(VARIANTS, TIS, AGGS)), ids=str
)
def test_micro_batches_add_up_to_the_whole_batch(variant, tis, agg):
    x = inputs(1)
    o = options(variant, tis, agg, beta=0.05)
    whole, grad, _ = loss_and_grad(x, o)
    norms = {"global_tokens": float(x["mask"].sum()), "global_seqs": float(x["mask"].any(1).sum())}
    parts = [[0, 3], [1, 4, 5], [2]]  # rows stay whole: a micro-batch (or a rank) holds rows
    total, grads = torch.zeros((), dtype=torch.float64), torch.zeros_like(grad)
    for rows in parts:
        loss, g, _ = loss_and_grad(x, o, rows, **norms)
        total += loss
        grads[rows] = g
    torch.testing.assert_close(total, whole, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grads, grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("tis", TIS[:2], ids=["no-tis", "token-tis"])
@pytest.mark.parametrize("agg", AGGS)
def test_with_one_update_per_batch_gspo_and_cispo_train_like_ppo(tis, agg):
    """old = logp.detach() (updates_per_batch = 1): every ratio is 1, nothing is clipped, and
    GSPO's and CISPO's gradients are PPO's; what moves them apart is a second update."""
    x = inputs(2)
    x["old"] = x["logp"].clone()
    _, ppo, _ = loss_and_grad(x, options(VARIANTS[0], tis, agg))
    for variant in (VARIANTS[1], VARIANTS[3], VARIANTS[4]):
        _, grad, metrics = loss_and_grad(x, options(variant, tis, agg))
        torch.testing.assert_close(grad, ppo, rtol=1e-12, atol=1e-15)
        assert metrics["ratio_min"] == metrics["ratio_max"] == 1.0


def test_gmpo_with_one_update_and_no_tis_is_grpo_per_sequence():
    x = inputs(3)
    x["old"] = x["logp"].clone()
    agg = "seq-mean-token-mean"
    _, ppo, _ = loss_and_grad(x, options(VARIANTS[0], None, agg))
    _, gmpo, _ = loss_and_grad(x, options(VARIANTS[2], None, agg))
    torch.testing.assert_close(gmpo, ppo, rtol=1e-12, atol=1e-15)


def test_gmpo_weighs_a_row_by_the_geometric_mean_of_its_tis_weights():
    x = inputs(4)
    x["old"] = x["logp"].clone()  # ratio 1: the row's loss is -w̄·A
    o = options(VARIANTS[2], L.TISConfig("token", cap=100.0), "seq-mean-token-mean")
    loss, _, _ = loss_and_grad(x, o)
    m = x["mask"]
    log_w = torch.where(m, x["old"] - x["behavior"], 0.0).sum(1) / m.sum(1)
    expected = (-torch.exp(log_w) * x["adv"]).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)


def test_gmpo_masked_out_tis_token_zeroes_its_row():
    x = inputs(5)
    x["behavior"][0] = x["old"][0] + 5.0  # every token's weight exp(-5) < cap_min: masked
    o = options(VARIANTS[2], L.TISConfig("token", "mask", 2.0, 0.5), "seq-mean-token-mean")
    _, grad, _ = loss_and_grad(x, o)
    assert grad[0].eq(0).all()
    assert grad[2:].ne(0).any()


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_padding_and_a_left_out_token_never_reach_loss_or_gradient(variant):
    """A token off the mask (padding, or an unknown kept set) may hold NaN: the loss is that of
    the row without it, for the sequence-level ratios too, and its gradient is exactly 0."""
    x = inputs(6)
    o = options(variant, TIS[1], "seq-mean-token-mean", beta=0.05)
    clean, grad, _ = loss_and_grad(x, o)
    for key in ("logp", "old", "behavior", "ref"):
        x[key] = torch.where(x["mask"], x[key], torch.nan)
    dirty, dirty_grad, _ = loss_and_grad(x, o)
    torch.testing.assert_close(dirty, clean, rtol=0, atol=0)
    assert dirty_grad[~x["mask"]].eq(0).all()
    torch.testing.assert_close(dirty_grad, grad, rtol=0, atol=0)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_gradients_flow_only_through_logp(variant):
    x = inputs(7)
    for key in ("old", "behavior", "ref", "adv"):
        x[key] = x[key].clone().requires_grad_(True)
    logp = x["logp"].clone().requires_grad_(True)
    o = options(variant, TIS[1], beta=0.05)
    loss, _ = L.policy_loss(
        logp, x["old"], x["behavior"], x["adv"], x["mask"], o, ref_logp=x["ref"]
    )
    loss.backward()
    assert logp.grad is not None
    assert logp.grad.abs().sum() > 0
    assert all(x[k].grad is None for k in ("old", "behavior", "ref", "adv"))


def test_gspo_clips_the_rows_geometric_mean_ratio():
    """mean log-ratio of a row above log(1 + clip_high) with A > 0: the whole row is clipped."""
    x = inputs(8)
    x["adv"][:] = 1.0
    x["old"] = x["logp"] - 0.3  # every token ratio e^0.3 > 1.05
    x["old"][0] = x["logp"][0] + torch.where(torch.arange(7) % 2 == 0, 0.3, -0.3)
    o = options(VARIANTS[1])
    _, grad, metrics = loss_and_grad(x, o)
    m = x["mask"]
    assert grad[1:][m[1:]].eq(0).all()  # clipped rows: no gradient
    row0 = grad[0][m[0]]
    mean0 = (x["logp"][0] - x["old"][0])[m[0]].mean()
    assert (row0 != 0).all() == bool(mean0 <= np.log(1.05))
    assert metrics["clip_frac_high"] > 0.5


def test_cispo_keeps_every_tokens_gradient_with_the_weight_clipped():
    x = inputs(9)
    x["adv"][:] = 1.0
    x["old"] = x["logp"] - 1.0  # ratio e ≈ 2.72: PPO clips every token away
    _, ppo, _ = loss_and_grad(x, options(VARIANTS[0]))
    _, cispo, metrics = loss_and_grad(x, options(VARIANTS[3]))
    m = x["mask"]
    assert ppo[m].eq(0).all()
    torch.testing.assert_close(cispo[m], torch.full_like(cispo[m], -1.28 / m.sum()))
    assert metrics["clip_frac_high"] == 1.0


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"objective": "gmpo", "ratio_level": "sequence"}, "sequence ratio is GSPO"),
        ({"objective": "cispo", "dual_clip": 3.0}, "'cispo' has none"),
        ({"objective": "gmpo", "dual_clip": 3.0}, "'gmpo' has none"),
        ({"objective": "ppo", "clip_low": 1.0}, "clip_low"),
        ({"objective": "cispo", "clip_low": 1.5}, "clip_low"),
        ({"objective": "adam"}, "objective must be one of"),
        ({"ratio_level": "group"}, "ratio_level must be one of"),
    ],
)
def test_a_combination_without_meaning_is_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        L.LossOptions(**kw)


def test_gmpo_takes_its_log_ratio_bounds_above_one():
    assert L.LossOptions(objective="gmpo", clip_low=1.5).clip_low == 1.5


# -- advantages ---------------------------------------------------------------------------------


def test_leave_one_out_is_r_minus_the_mean_of_the_others():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    adv = ADV.group_advantages(r, baseline="leave-one-out", scale="none")
    expected = [r[0, i] - (r[0].sum() - r[0, i]) / 4 for i in range(5)]
    torch.testing.assert_close(adv[0], torch.stack(expected))


def test_whitening_weighs_each_completion_by_its_tokens():
    r = torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    n = torch.tensor([[3, 1], [2, 0]])
    adv = ADV.group_advantages(r, baseline="batch-whiten", scale="none", tokens_NG=n)
    # token values 1,1,1,0,0,0 (the empty completion counts nowhere): mean 0.5, var 0.3
    expected = (r - 0.5) / np.sqrt(0.3 + 1e-8)
    torch.testing.assert_close(adv, expected)
    base = ADV.group_advantages(r, baseline="group-whiten", scale="none", tokens_NG=n)
    a = torch.tensor([[0.5, -0.5], [0.0, 0.0]], dtype=torch.float64)  # r - group mean
    mu = (a * n).sum() / 6
    var = ((a - mu) ** 2 * n).sum() / 5
    torch.testing.assert_close(base, (a - mu) / torch.sqrt(var + 1e-8))


def test_whitening_fewer_than_two_tokens_gives_zeros():
    r = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    adv = ADV.group_advantages(
        r, baseline="batch-whiten", scale="none", tokens_NG=torch.tensor([[1, 0]])
    )
    assert adv.eq(0).all()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"baseline": "group-whiten"}, "use scale 'none'"),
        ({"baseline": "batch-whiten", "scale": "none"}, "needs tokens_NG"),
        ({"baseline": "median"}, "baseline must be one of"),
    ],
)
def test_whitened_baselines_refuse_what_they_cannot_use(kw, message):
    with pytest.raises(ValueError, match=message):
        ADV.group_advantages(torch.zeros(2, 2), **kw)


def test_overlong_punishment_is_dapos_soft_ramp():
    lengths = torch.tensor([[10, 12, 13, 16, 20]])
    p = ADV.overlong_penalty(lengths, max_len=20, window=8, penalty=0.5)
    torch.testing.assert_close(p, torch.tensor([[0.0, 0.0, -1 / 16, -0.25, -0.5]], dtype=p.dtype))
    with pytest.raises(ValueError, match="overlong window"):
        ADV.overlong_penalty(lengths, max_len=20, window=21, penalty=1.0)


def test_overlong_punishment_is_added_to_the_rewards_before_the_baseline():
    o = ADV.AdvantageOptions(scale="none", overlong_window=4, max_len=8)
    r = torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    adv = ADV.advantages_of(r, o, lengths_NG=torch.tensor([[2, 8, 2, 6]]))
    shaped = r + torch.tensor([[0.0, -1.0, 0.0, -0.5]], dtype=torch.float64)
    torch.testing.assert_close(adv, shaped - shaped.mean())
    with pytest.raises(ValueError, match="needs lengths_NG"):
        ADV.advantages_of(r, o)


def _group(rewards, lens, unknown=()):
    n = int(sum(lens))
    return wire.Group(
        lease_id=1,
        producer_id="p",
        prompt_index=0,
        behavior_version=0,
        prompt_ids=np.zeros(2, np.int32),
        completion_ids=np.ones(n, np.int32),
        completion_lens=np.asarray(lens, np.int32),
        behavior_logp=np.full(n, -1.0, np.float32),
        token_versions=np.zeros(0, np.int32),
        rewards=np.asarray(rewards, np.float32),
        finish_reasons=("stop",) * len(lens),
        temperature=1.0,
        kept_counts=np.zeros(n, np.uint8) if unknown else np.zeros(0, np.uint8),
        kept_unknown=np.asarray(unknown, np.int32),
    )


def test_the_trainer_whitens_over_trained_tokens_and_punishes_lengths():
    groups = [_group([1, 0, 1], [3, 2, 4], unknown=[0, 4, 5]), _group([0, 1, 1], [1, 1, 1])]
    cfg = C.override(
        C.Config(),
        {
            "loss.adv_baseline": "group-whiten",
            "loss.adv_scale": "none",
            "loss.overlong_window": 2,
            "sampling.max_new_tokens": 4,
        },
    )
    adv = batch_advantages(groups, advantage_options(cfg))
    r = torch.tensor([[1 - 0.5, 0, 1 - 1.0], [0, 1, 1]], dtype=torch.float64)  # lengths 3, 4
    tokens = torch.tensor([[2, 1, 3], [1, 1, 1]])  # tokens 0, 4, 5 of the first group unknown
    expected = ADV.group_advantages(r, baseline="group-whiten", scale="none", tokens_NG=tokens)
    np.testing.assert_allclose(adv, expected.numpy(), rtol=1e-12)


def test_the_default_config_builds_todays_options():
    o = loss_options(C.Config())
    assert (o.objective, o.ratio_level) == ("ppo", "token")
    a = advantage_options(C.Config())
    assert (a.baseline, a.scale, a.overlong_window) == ("group", "group", 0)
