"""Micro-batch planning, rows, and collation (shifted positions, masks, behaviour log-probs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import wire
from common.sampling import kept_set
from consumer.train.batching import (
    Row,
    collate,
    loss_normalisers,
    plan_micro_batches,
    rows_of,
    split_by_tokens,
)

CPU = torch.device("cpu")
PAD = 0


def make_group(prompt: list[int], completions: list[list[int]], *, lease_id: int = 0) -> wire.Group:
    ids = [t for c in completions for t in c]
    return wire.Group(
        lease_id=lease_id,
        producer_id="p",
        prompt_index=0,
        behavior_version=0,
        prompt_ids=np.array(prompt, np.int32),
        completion_ids=np.array(ids, np.int32),
        completion_lens=np.array([len(c) for c in completions], np.int32),
        behavior_logp=-np.arange(1, len(ids) + 1, dtype=np.float32) / 10,
        token_versions=np.zeros(0, np.int32),
        rewards=np.arange(len(completions), dtype=np.float32),
        finish_reasons=("stop",) * len(completions),
        temperature=1.0,
    )


def make_row(prompt: list[int], completion: list[int], *, advantage: float = 0.0) -> Row:
    return Row(
        ids=np.array(prompt + completion, np.int32),
        prompt_len=len(prompt),
        behavior_logp=-np.arange(1, len(completion) + 1, dtype=np.float32) / 10,
        advantage=advantage,
        group=0,
    )


# ---------------------------------------------------------------------------------------------
# plan_micro_batches


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 300), max_size=40), budget=st.integers(1, 2000))
def test_micro_batches_partition_the_rows_within_the_token_budget(lengths, budget):
    plan = plan_micro_batches(lengths, budget)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:
        assert mb
        assert len(mb) * max(lengths[i] for i in mb) <= budget or len(mb) == 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 300), max_size=40), budget=st.integers(1, 2000))
def test_packed_micro_batches_hold_at_most_the_budget_in_real_tokens(lengths, budget):
    plan = plan_micro_batches(lengths, budget, packed=True)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:
        assert sum(lengths[i] for i in mb) <= budget or len(mb) == 1
    # first fit: no row could have joined an earlier micro-batch
    totals = [sum(lengths[i] for i in mb) for mb in plan]
    for k, mb in enumerate(plan):
        for i in mb:
            assert all(totals[j] + lengths[i] > budget for j in range(k) if i not in plan[j])


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        ([], 100, []),
        ([10, 60, 30, 50], 100, [[1, 2, 0], [3]]),  # padded: 2 x 60 > 100
        ([50, 10, 30, 10], 60, [[0, 1], [2, 3]]),
        ([500, 5], 100, [[0], [1]]),  # a row longer than the budget gets its own micro-batch
        ([7, 7, 7], 1, [[0], [1], [2]]),
    ],
)
def test_packed_micro_batch_plans(lengths, budget, expected):
    assert plan_micro_batches(lengths, budget, packed=True) == expected


def test_packing_needs_fewer_micro_batches_than_padding_on_mixed_lengths():
    lengths = [500] * 4 + [50] * 4
    assert len(plan_micro_batches(lengths, 2200)) == 2  # padded: 4 x 50, then 4 x 500
    assert len(plan_micro_batches(lengths, 2200, packed=True)) == 1


def test_loss_normalisers_count_completion_tokens_and_rows():
    rows = [make_row([1, 2], [3]), make_row([4], [5, 6, 7])]
    assert loss_normalisers(rows) == (4, 2)


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        ([], 100, []),
        ([10, 10, 10, 10], 40, [[0, 1, 2, 3]]),
        ([10, 10, 10, 10], 39, [[0, 1, 2], [3]]),
        ([50, 10, 30, 10], 60, [[1, 3], [2], [0]]),  # by length: 3 rows x 30 > 60
        ([50, 10, 30, 10], 90, [[1, 3, 2], [0]]),
        ([500, 5], 100, [[1], [0]]),  # a row longer than the budget gets its own micro-batch
        ([7, 7, 7], 1, [[0], [1], [2]]),
    ],
)
def test_micro_batch_plans(lengths, budget, expected):
    assert plan_micro_batches(lengths, budget) == expected


# ---------------------------------------------------------------------------------------------
# collate


def test_collate_lays_out_shifted_positions():
    rows = [make_row([10, 11, 12], [20, 21], advantage=0.5), make_row([13], [30, 31, 32, 33])]
    mb = collate(rows, [0, 1], pad_id=PAD, device=CPU)
    assert mb.input_ids_BL.tolist() == [[10, 11, 12, 20, 21], [13, 30, 31, 32, 33]]
    assert mb.attention_mask_BL is None  # equal lengths: causal attention alone is exact
    assert mb.position_ids_BL is None
    assert mb.cu_seqlens is None
    assert not mb.packed
    assert mb.tokens_BT.tolist() == [[11, 12, 20, 21], [30, 31, 32, 33]]
    # position j predicts token j + 1: the completion tokens of row 0 sit at j = 2, 3
    assert mb.mask_BT.tolist() == [[False, False, True, True], [True, True, True, True]]
    expected = torch.tensor([[0.0, 0.0, -0.1, -0.2], [-0.1, -0.2, -0.3, -0.4]])
    torch.testing.assert_close(mb.behavior_logp_BT, expected)
    assert mb.advantages_B.tolist() == [0.5, 0.0]
    assert mb.rows == (0, 1)
    assert mb.num_tokens == 6
    # the outputs at flat positions b * 5 + j predict the completion tokens
    assert mb.hidden_index_N.tolist() == [2, 3, 5, 6, 7, 8]
    assert mb.tokens_N.tolist() == [20, 21, 30, 31, 32, 33]
    assert mb.max_seqlen == 5
    assert mb.num_positions == 10


def test_packed_rows_are_one_sequence_with_positions_restarting_per_row():
    rows = [make_row([10, 11, 12], [20, 21], advantage=0.5), make_row([13], [30, 31, 32])]
    mb = collate(rows, [1, 0], pad_id=PAD, device=CPU, packed=True)
    assert mb.packed
    assert mb.attention_mask_BL is None
    assert mb.input_ids_BL.tolist() == [[13, 30, 31, 32, 10, 11, 12, 20, 21]]
    assert mb.position_ids_BL.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4]]
    assert mb.cu_seqlens.tolist() == [0, 4, 9]
    assert mb.cu_seqlens.dtype == torch.int32
    assert mb.max_seqlen == 5
    assert mb.num_positions == 9
    # row 1 (first here) predicts from its positions 0..2, row 0 from its positions 2..3
    assert mb.hidden_index_N.tolist() == [0, 1, 2, 6, 7]
    assert mb.tokens_N.tolist() == [30, 31, 32, 20, 21]
    assert mb.input_ids_BL[0, mb.hidden_index_N + 1].tolist() == mb.tokens_N.tolist()


def test_the_loss_frame_is_the_same_packed_or_padded():
    rows = [make_row([1, 2, 3], [4, 5], advantage=1.0), make_row([6], [7, 8, 9, 10])]
    padded = collate(rows, [0, 1], pad_id=PAD, device=CPU)
    packed = collate(rows, [0, 1], pad_id=PAD, device=CPU, packed=True)
    for name in ("tokens_BT", "mask_BT", "behavior_logp_BT", "advantages_B", "tokens_N"):
        assert torch.equal(getattr(padded, name), getattr(packed, name)), name
    assert padded.num_tokens == packed.num_tokens == 6


def test_collate_pads_short_rows_on_the_right_outside_the_mask():
    rows = [make_row([1, 2], [3]), make_row([4, 5, 6], [7, 8, 9])]
    mb = collate(rows, [1, 0], pad_id=99, device=CPU)
    assert mb.rows == (1, 0)
    assert mb.input_ids_BL.tolist() == [[4, 5, 6, 7, 8, 9], [1, 2, 3, 99, 99, 99]]
    assert mb.attention_mask_BL.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    assert mb.attention_mask_BL.dtype == torch.int64
    assert mb.mask_BT.tolist()[1] == [False, True, False, False, False]
    assert mb.behavior_logp_BT[1].tolist() == pytest.approx([0.0, -0.1, 0.0, 0.0, 0.0])


def test_collate_puts_every_tensor_on_the_device_asked_for():
    meta = torch.device("meta")  # a device that holds no data: every tensor must be moved there
    rows = [make_row([1], [2, 3]), make_row([4, 5], [6, 7])]
    for packed in (False, True):
        mb = collate(rows, [0, 1], pad_id=PAD, device=meta, packed=packed)
        tensors = [getattr(mb, f) for f in mb.__slots__ if isinstance(getattr(mb, f), torch.Tensor)]
        assert len(tensors) == (9 if packed else 8)
        assert [t.device.type for t in tensors] == ["meta"] * len(tensors)


def test_collate_ids_are_int64_whatever_type_the_pad_id_has():
    rows = [make_row([1], [2, 3]), make_row([1], [2])]
    mb = collate(rows, [0, 1], pad_id=np.int32(7), device=CPU)
    assert mb.input_ids_BL.dtype == torch.int64
    assert mb.tokens_BT.dtype == torch.int64
    assert mb.input_ids_BL.tolist() == [[1, 2, 3], [1, 2, 7]]
    assert mb.tokens_BT.tolist() == [[2, 3], [2, 7]]


def test_collate_dtypes_do_not_follow_torchs_default_dtype():
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        mb = collate([make_row([1], [2, 3], advantage=0.5)], [0], pad_id=PAD, device=CPU)
    finally:
        torch.set_default_dtype(default)
    assert mb.advantages_B.dtype == torch.float32
    assert mb.behavior_logp_BT.dtype == torch.float32


@pytest.mark.parametrize("packed", [False, True])
def test_collate_dtypes(packed):
    mb = collate([make_row([1], [2, 3])], [0], pad_id=PAD, device=CPU, packed=packed)
    assert mb.input_ids_BL.dtype == torch.int64
    assert mb.hidden_index_N.dtype == torch.int64
    assert mb.tokens_N.dtype == torch.int64
    assert mb.tokens_BT.dtype == torch.int64
    assert mb.mask_BT.dtype == torch.bool
    assert mb.behavior_logp_BT.dtype == torch.float32
    assert mb.advantages_B.dtype == torch.float32


ROWS = st.lists(
    st.tuples(
        st.lists(st.integers(1, 1000), min_size=1, max_size=6),
        st.lists(st.integers(1, 1000), min_size=1, max_size=6),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=ROWS, packed=st.booleans())
def test_the_mask_marks_exactly_the_completion_tokens(spec, packed):
    rows = [make_row(p, c, advantage=float(i)) for i, (p, c) in enumerate(spec)]
    mb = collate(rows, list(range(len(rows))), pad_id=PAD, device=CPU, packed=packed)
    B, T = mb.tokens_BT.shape
    assert max(len(p) + len(c) for p, c in spec) - 1 == T
    for b, (prompt, completion) in enumerate(spec):
        ids = prompt + completion
        mask = mb.mask_BT[b]
        positions = [j for j in range(T) if mask[j]]
        assert positions == list(range(len(prompt) - 1, len(ids) - 1))
        for j in positions:
            assert mb.tokens_BT[b, j] == ids[j + 1]
        assert mb.tokens_BT[b][mask].tolist() == completion
        assert mb.behavior_logp_BT[b][mask].tolist() == rows[b].behavior_logp.tolist()
        assert not mb.behavior_logp_BT[b][~mask].any()
        if mb.attention_mask_BL is not None:
            assert mb.attention_mask_BL[b].sum() == len(ids)
    assert mb.num_tokens == sum(len(c) for _, c in spec)
    assert mb.advantages_B.tolist() == [float(i) for i in range(B)]
    # the position each completion token is predicted from holds the token before it
    flat_ids = mb.input_ids_BL.flatten()
    assert flat_ids[mb.hidden_index_N + 1].tolist() == mb.tokens_N.tolist()
    assert mb.tokens_N.tolist() == mb.tokens_BT[mb.mask_BT].tolist()
    equal = len({len(p) + len(c) for p, c in spec}) == 1
    assert (mb.attention_mask_BL is None) == (packed or equal)


# ---------------------------------------------------------------------------------------------
# rows_of


def test_rows_follow_group_order_with_their_advantages():
    groups = [
        make_group([1, 2], [[3], [4, 5]]),
        make_group([6], [[7, 8, 9], [10], [11]], lease_id=1),
    ]
    advantages_NG = np.array([[0.5, -0.5, np.nan], [1.0, 0.0, -1.0]])  # NaN: padding, unused
    rows = rows_of([groups[0], groups[1]], advantages_NG)
    assert [r.ids.tolist() for r in rows] == [
        [1, 2, 3],
        [1, 2, 4, 5],
        [6, 7, 8, 9],
        [6, 10],
        [6, 11],
    ]
    assert [r.prompt_len for r in rows] == [2, 2, 1, 1, 1]
    assert [r.group for r in rows] == [0, 0, 1, 1, 1]
    assert [r.advantage for r in rows] == [0.5, -0.5, 1.0, 0.0, -1.0]
    assert rows[1].behavior_logp.tolist() == pytest.approx([-0.2, -0.3])
    assert rows[2].behavior_logp.tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert all(r.ids.dtype == np.int32 for r in rows)
    assert all(r.behavior_logp.dtype == np.float32 for r in rows)


def test_rows_hold_the_schema_dtypes_whatever_the_groups_arrays_are():
    g = make_group([1, 2], [[3], [4, 5]])
    g64 = dataclasses.replace(g, behavior_logp=g.behavior_logp.astype(np.float64))
    for row in rows_of([g64], np.array([[1.0, -1.0]])):
        assert row.behavior_logp.dtype == np.float32
        assert row.ids.dtype == np.int32


def test_rows_of_a_decoded_group_collate_back_to_its_tokens():
    g = wire.decode(wire.encode(make_group([5, 6, 7], [[8, 9], [10, 11, 12]])))
    rows = rows_of([g], np.array([[1.0, -1.0]]))
    (indices,) = plan_micro_batches([len(r.ids) for r in rows], 1000)
    mb = collate(rows, indices, pad_id=PAD, device=CPU)
    assert mb.tokens_BT[mb.mask_BT].tolist() == g.completion_ids.tolist()
    assert mb.behavior_logp_BT[mb.mask_BT].tolist() == g.behavior_logp.tolist()


def test_split_by_tokens_balances_and_is_deterministic() -> None:
    lengths = [10, 3, 7, 7, 2, 9, 1]
    owner = split_by_tokens(lengths, 2)
    loads = [sum(n for n, k in zip(lengths, owner, strict=True) if k == r) for r in range(2)]
    assert sorted(loads) == [19, 20]  # decreasing lengths to the lighter part: 10,9,7,7,3,2,1
    assert owner == split_by_tokens(list(lengths), 2)
    assert split_by_tokens(lengths, 1) == [0] * len(lengths)
    assert split_by_tokens([5], 3) == [0]  # more parts than rows: the first part takes it
    assert split_by_tokens([4, 4, 4], 3) == [0, 1, 2]  # ties go to the lowest part


@given(st.lists(st.integers(1, 50), max_size=40), st.integers(1, 5))
def test_split_by_tokens_is_within_one_row_of_even(lengths: list[int], parts: int) -> None:
    owner = split_by_tokens(lengths, parts)
    assert len(owner) == len(lengths)
    assert all(0 <= k < parts for k in owner)
    loads = [sum(n for n, k in zip(lengths, owner, strict=True) if k == r) for r in range(parts)]
    assert max(loads) - min(loads) <= max(lengths, default=0)


# ---------------------------------------------------------------------------------------------
# Kept sets (truncated sampling)


def test_rows_carry_their_completions_kept_sets_and_collate_lays_them_out_per_token():
    g = make_group([1, 2], [[5, 6], [7, 8, 9]])
    kept = kept_set.from_lists(
        [np.array([3], np.int32), np.zeros(0, np.int32), np.array([1, 2, 4], np.int32),
         np.zeros(0, np.int32), np.array([0], np.int32)],
        unknown=[3],
    )  # fmt: skip
    g = dataclasses.replace(
        g, kept_counts=kept.other_counts(), kept_ids=kept.ids, kept_unknown=kept.unknown
    )
    rows = rows_of([g], np.zeros((1, 2)))
    assert rows[1].kept.offsets.tolist() == [0, 3, 3, 4]
    assert rows[1].kept.unknown.tolist() == [1]
    assert [r.num_trained for r in rows] == [2, 2]
    assert loss_normalisers(rows) == (4, 2)
    for packed in (False, True):
        mb = collate(rows, [0, 1], pad_id=PAD, device=CPU, packed=packed)
        assert mb.tokens_N.tolist() == [5, 6, 7, 9]  # token 8's kept set is unknown
        assert (mb.num_tokens, mb.num_unknown) == (4, 1)
        assert mb.mask_BT.sum() == 4
        assert mb.kept_NK.tolist() == [[5, 3, 0, 0], [6, 0, 0, 0], [7, 1, 2, 4], [9, 0, 0, 0]]
        assert mb.kept_valid_NK.sum(1).tolist() == [2, 1, 4, 2]
        assert mb.kept_valid_NK[3, 1]  # the id 0 there is a real entry, not padding


def test_rows_without_kept_sets_collate_without_them():
    rows = rows_of([make_group([1, 2], [[5, 6], [7]])], np.zeros((1, 2)))
    mb = collate(rows, [0, 1], pad_id=PAD, device=CPU)
    assert mb.kept is None
    assert mb.num_unknown == 0
