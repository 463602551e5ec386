"""Properties of consumer/train/loss.py that hold for any input (hypothesis; float64 on CPU)."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.train import advantages as ADV
from consumer.train import loss as L

SETTINGS = settings(max_examples=30, deadline=None)
PER_TOKEN = ("logp", "old", "behavior", "ref")
TIS_SPECS = [
    None,
    L.TISConfig("token", "truncate", 2.0, None),
    L.TISConfig("token", "mask", 2.0, 0.5),
    L.TISConfig("sequence", "truncate", 1.5, 0.7),
    L.TISConfig("sequence", "mask", 5.0, None),
]


@st.composite
def batches(draw: st.DrawFn, max_rows: int = 6, max_len: int = 6) -> dict[str, torch.Tensor]:
    """A float64 batch with an arbitrary mask pattern; padding holds zeros."""
    B, T = draw(st.integers(1, max_rows)), draw(st.integers(1, max_len))
    rows = st.lists(st.booleans(), min_size=T, max_size=T)
    mask = np.array(draw(st.lists(rows, min_size=B, max_size=B)), dtype=bool)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    old = -rng.gamma(1.0, 1.0, (B, T))
    values = {
        "logp": old + rng.normal(0, 0.4, (B, T)),
        "old": old,
        "behavior": old + rng.normal(0, 0.6, (B, T)),
        "ref": old + rng.normal(0, 0.5, (B, T)),
    }
    batch = {k: torch.from_numpy(np.where(mask, v, 0.0)) for k, v in values.items()}
    return batch | {"adv": torch.from_numpy(rng.normal(0, 1, B)), "mask": torch.from_numpy(mask)}


options = st.fixed_dictionaries(
    {
        "agg": st.sampled_from(L.AGG_MODES),
        "tis": st.sampled_from(TIS_SPECS),
        "dual_clip": st.sampled_from([None, 3.0]),
        "kl": st.sampled_from(L.KL_KINDS),
        "beta": st.sampled_from([0.0, 0.1]),
        "norm_const": st.just(6.0),
    }
)


def loss_and_grad(batch, global_tokens=None, global_seqs=None, **options):
    logp = batch["logp"].clone().requires_grad_(True)
    loss, metrics = L.policy_loss(
        logp,
        batch["old"],
        batch["behavior"],
        batch["adv"],
        batch["mask"],
        L.LossOptions(**options),
        ref_logp=batch["ref"],
        global_tokens=global_tokens,
        global_seqs=global_seqs,
    )
    loss.backward()
    return loss.item(), logp.grad, metrics


def with_padding(batch, fill: float, extra_cols: int = 0, empty_row: bool = False):
    """The same batch with `fill` at every padding position, wider and/or with an empty row."""
    B, T = batch["mask"].shape
    mask = torch.zeros(B + empty_row, T + extra_cols, dtype=torch.bool)
    mask[:B, :T] = batch["mask"]
    out = {
        "mask": mask,
        "adv": torch.cat([batch["adv"], torch.full((int(empty_row),), fill, dtype=torch.float64)]),
    }
    for k in PER_TOKEN:
        padded = torch.full(mask.shape, fill, dtype=torch.float64)
        padded[:B, :T] = batch[k]
        out[k] = torch.where(mask, padded, fill)
    return out


@given(
    batch=batches(),
    opts=options,
    fill=st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -7.0]),
)
@SETTINGS
def test_padding_values_never_reach_the_loss_the_metrics_or_the_gradient(batch, opts, fill):
    loss, grad, metrics = loss_and_grad(batch, **opts)
    loss_f, grad_f, metrics_f = loss_and_grad(with_padding(batch, fill), **opts)
    assert loss_f == loss
    assert metrics_f == metrics
    assert torch.equal(grad_f, grad)
    assert grad_f[~batch["mask"]].eq(0).all()
    wide = with_padding(batch, fill, extra_cols=3, empty_row=True)
    loss_w, grad_w, metrics_w = loss_and_grad(wide, **opts)
    assert math.isclose(loss_w, loss, rel_tol=1e-12, abs_tol=1e-12)
    assert all(
        math.isclose(metrics_w[k], v, rel_tol=1e-12, abs_tol=1e-12) for k, v in metrics.items()
    )
    torch.testing.assert_close(grad_w[: grad.shape[0], : grad.shape[1]], grad, rtol=1e-12, atol=0)
    assert torch.isfinite(grad_w).all()


@given(batch=batches(), opts=options)
@SETTINGS
def test_where_a_rows_tokens_sit_in_the_row_does_not_matter(batch, opts):
    """Prompt offsets and gaps in the mask: moving each row's tokens to the left changes nothing."""
    order = torch.argsort((~batch["mask"]).to(torch.int8), dim=1, stable=True)
    moved = {k: batch[k].gather(1, order) for k in (*PER_TOKEN, "mask")} | {"adv": batch["adv"]}
    loss, grad, metrics = loss_and_grad(batch, **opts)
    loss_m, grad_m, metrics_m = loss_and_grad(moved, **opts)
    assert math.isclose(loss_m, loss, rel_tol=1e-12, abs_tol=1e-12)
    assert all(
        math.isclose(metrics_m[k], v, rel_tol=1e-12, abs_tol=1e-12) for k, v in metrics.items()
    )
    torch.testing.assert_close(grad_m, grad.gather(1, order), rtol=1e-12, atol=0)


@given(batch=batches(max_rows=8), opts=options, data=st.data())
@SETTINGS
def test_micro_batch_losses_add_up_to_the_batch_loss_under_global_normalisers(batch, opts, data):
    B = batch["mask"].shape[0]
    parts = data.draw(st.lists(st.integers(0, 3), min_size=B, max_size=B), label="micro-batch")
    full_loss, full_grad, _ = loss_and_grad(batch, **opts)
    valid = batch["mask"]
    totals = {"global_tokens": int(valid.sum()), "global_seqs": int(valid.any(1).sum())}
    summed, grad = 0.0, torch.zeros_like(full_grad)
    for part in set(parts):
        rows = torch.tensor([b for b in range(B) if parts[b] == part])
        width = int(valid[rows].any(0).nonzero().max()) + 1 if valid[rows].any() else 1
        micro = {k: v[rows][:, :width] if v.ndim == 2 else v[rows] for k, v in batch.items()}
        loss, g, _ = loss_and_grad(micro, **opts, **totals)
        summed += loss
        grad[rows, :width] += g
    assert math.isclose(summed, full_loss, rel_tol=1e-12, abs_tol=1e-12)
    torch.testing.assert_close(grad, full_grad, rtol=1e-12, atol=1e-15)


rewards_st = st.floats(-1e3, 1e3, allow_nan=False, width=64)


@st.composite
def reward_groups(draw: st.DrawFn) -> list[list[float]]:
    G = draw(st.integers(2, 8))
    groups = []
    for _ in range(draw(st.integers(1, 5))):
        if draw(st.booleans()):
            groups.append([draw(rewards_st)] * G)
        else:
            groups.append(draw(st.lists(rewards_st, min_size=G, max_size=G)))
    return groups


@given(
    groups=reward_groups(),
    scale=st.sampled_from(ADV.ADV_SCALES),
    eps=st.sampled_from([1e-6, 0.0]),
)
@SETTINGS
def test_constant_groups_get_exactly_zero_and_advantages_keep_the_reward_order(groups, scale, eps):
    rewards = torch.tensor(groups, dtype=torch.float64)
    adv = ADV.group_advantages(rewards, scale=scale, eps=eps)
    for r, a in zip(rewards, adv, strict=True):
        if (r == r[0]).all():
            assert (a == 0).all()
            continue
        assert torch.isfinite(a).all()
        assert (a[torch.argsort(r)].diff() >= 0).all()
        if scale == "none":
            assert abs(a.sum().item()) <= 1e-9 * float(r.abs().max())


@given(
    batch=batches(),
    level=st.sampled_from(L.TIS_LEVELS),
    mode=st.sampled_from(L.TIS_MODES),
    caps=st.tuples(st.floats(0.1, 5.0), st.one_of(st.none(), st.floats(0.0, 1.0))),
)
@SETTINGS
def test_importance_weights_lie_within_the_caps_and_vanish_at_padding(batch, level, mode, caps):
    cap, cap_min = caps[0], None if caps[1] is None else caps[1] * caps[0]
    w = L.importance_weights(
        batch["old"],
        batch["behavior"],
        batch["mask"],
        level=level,
        mode=mode,
        cap=cap,
        cap_min=cap_min,
    )
    valid = w[batch["mask"]]
    low = 0.0 if cap_min is None else cap_min
    inside = (valid >= low) & (valid <= cap)
    assert (inside | (valid == 0)).all() if mode == "mask" else inside.all()
    assert w[~batch["mask"]].eq(0).all()
