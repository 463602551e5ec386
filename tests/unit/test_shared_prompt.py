"""consumer/train/shared_prompt.py: a group's prompt once, its completions after it (layout, mask,
where each token's prediction is read, micro-batches of whole groups, when it pays)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.train import shared_prompt as SP
from consumer.train.batching import Row, collate

CPU = torch.device("cpu")
PAD = 0
# SmolLM2-135M's shapes (docs/real_model.md)
SMOLLM2 = SP.Shapes.of(
    SimpleNamespace(
        hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536
    )
)


def group_rows(spec: list[tuple[list[int], list[list[int]]]]) -> list[Row]:
    """Rows of groups given as (prompt, completions); group k's rows share its prompt."""
    rows = []
    for k, (prompt, completions) in enumerate(spec):
        for c in completions:
            rows.append(
                Row(
                    ids=np.array(prompt + c, np.int32),
                    prompt_len=len(prompt),
                    behavior_logp=-np.arange(1, len(c) + 1, dtype=np.float32) / 10,
                    advantage=float(k),
                    group=k,
                )
            )
    return rows


def test_a_group_is_one_sequence_its_prompt_once_then_each_completion():
    rows = group_rows([([7, 8, 9], [[11, 12], [13]]), ([5], [[21, 22, 23]])])
    mb = collate(rows, [0, 1, 2], pad_id=PAD, device=CPU, shared_prompt=True)
    assert mb.layout == "shared_prompt"
    assert mb.input_ids_BL.tolist() == [[7, 8, 9, 11, 12, 13], [5, 21, 22, 23, 0, 0]]
    assert mb.position_ids_BL.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 3, 0, 0]]
    assert mb.num_real == 10
    assert mb.num_positions == 12
    # the loss frame is the padded layout's, row for row
    padded = collate(rows, [0, 1, 2], pad_id=PAD, device=CPU)
    for name in ("tokens_BT", "mask_BT", "behavior_logp_BT", "advantages_B", "tokens_N"):
        assert torch.equal(getattr(mb, name), getattr(padded, name)), name


def test_each_completion_sees_its_prompt_and_its_own_earlier_tokens_only():
    rows = group_rows([([7, 8], [[11, 12], [13, 14]])])
    mb = collate(rows, [0, 1], pad_id=PAD, device=CPU, shared_prompt=True)
    mask = mb.attention_mask_BL[0, 0].int().tolist()
    #        keys: p0 p1 a0 a1 b0 b1
    assert mask == [
        [1, 0, 0, 0, 0, 0],  # p0
        [1, 1, 0, 0, 0, 0],  # p1
        [1, 1, 1, 0, 0, 0],  # a0
        [1, 1, 1, 1, 0, 0],  # a1
        [1, 1, 0, 0, 1, 0],  # b0: the prompt, not completion a
        [1, 1, 0, 0, 1, 1],  # b1
    ]


def test_padding_positions_attend_to_something_so_no_nan_reaches_the_backward():
    rows = group_rows([([7], [[11]]), ([5, 6], [[21, 22, 23], [24]])])
    mb = collate(rows, [0, 1, 2], pad_id=PAD, device=CPU, shared_prompt=True)
    assert bool(mb.attention_mask_BL.any(-1).all())


def test_the_first_token_is_predicted_at_the_prompts_last_position_for_every_row():
    rows = group_rows([([7, 8, 9], [[11, 12], [13]])])
    mb = collate(rows, [0, 1], pad_id=PAD, device=CPU, shared_prompt=True)
    # sequence: 7 8 9 11 12 13; tokens 11, 12 (row 0) then 13 (row 1)
    assert mb.tokens_N.tolist() == [11, 12, 13]
    assert mb.hidden_index_N.tolist() == [2, 3, 2]


def test_one_sequence_holds_the_common_prefix_once_then_each_group():
    rows = group_rows([([7, 8, 9], [[11, 12], [13]]), ([7, 8, 5], [[21]])])
    b_N, j_N = np.nonzero(collate(rows, [0, 1, 2], pad_id=PAD, device=CPU).mask_BT.numpy())
    laid = SP.one_sequence(rows, b_N, j_N, pad_id=PAD)
    #           common  rest a0  a1  b0  rest c0
    assert laid.input_ids_KL.tolist() == [[7, 8, 9, 11, 12, 13, 5, 21]]
    assert laid.position_ids_KL.tolist() == [[0, 1, 2, 3, 4, 3, 2, 3]]
    mask = laid.mask_KLL[0].astype(int).tolist()
    assert mask == [
        [1, 0, 0, 0, 0, 0, 0, 0],  # 7
        [1, 1, 0, 0, 0, 0, 0, 0],  # 8
        [1, 1, 1, 0, 0, 0, 0, 0],  # 9: group 1's rest
        [1, 1, 1, 1, 0, 0, 0, 0],  # 11
        [1, 1, 1, 1, 1, 0, 0, 0],  # 12
        [1, 1, 1, 0, 0, 1, 0, 0],  # 13: its prompt, not completion 11 12
        [1, 1, 0, 0, 0, 0, 1, 0],  # 5: group 2's rest sees the common prefix only
        [1, 1, 0, 0, 0, 0, 1, 1],  # 21
    ]
    assert laid.hidden_index_N.tolist() == [2, 3, 2, 6]  # 11 12 13 21
    assert SP.one_length(rows) == 8


def test_on_the_real_task_one_sequence_runs_a_quarter_of_the_rows_positions():
    prompts = [[1] * 29 + [k + 2] * 15 for k in range(8)]  # 44 tokens, 29 shared
    rows = group_rows([(p, [[9] * 8] * 4) for p in prompts])
    assert SP.one_length(rows) == 29 + 8 * (15 + 32) == 405
    assert SP.group_lengths(rows) == [76] * 8
    assert sum(len(r.ids) for r in rows) == 1664
    assert SP.layout_for(rows, SMOLLM2) == "one"


@settings(max_examples=100, deadline=None)
@given(
    spec=st.lists(
        st.tuples(
            st.integers(1, 6),
            st.lists(st.integers(1, 5), min_size=1, max_size=4),
        ),
        min_size=1,
        max_size=4,
    ),
    seed=st.integers(0, 100),
    one=st.booleans(),
)
def test_every_token_is_predicted_from_the_position_just_before_it(spec, seed, one):
    """Reading the layout back: the input at hidden_index_N is the token before each trained
    token in its own row, at the row's own position, and what that position may attend to is
    exactly the row's tokens so far, each at its own position (the row's causal view)."""
    rng = np.random.default_rng(seed)
    head = rng.integers(1, 50, 3).tolist()  # a prefix some prompts share
    rows = group_rows(
        [
            (
                (head[: p % 4] + rng.integers(1, 50, p).tolist())[: max(p, 1)],
                [rng.integers(1, 50, c).tolist() for c in cs],
            )
            for p, cs in spec
        ]
    )
    order = list(rng.permutation(len(rows)))
    mb = collate(rows, order, pad_id=PAD, device=CPU, shared_prompt=True, one_sequence=one)
    L = mb.input_ids_BL.shape[1]
    b_N, j_N = mb.mask_BT.nonzero(as_tuple=True)
    for n, (b, j) in enumerate(zip(b_N.tolist(), j_N.tolist(), strict=True)):
        row = rows[order[b]]
        k, at = divmod(int(mb.hidden_index_N[n]), L)
        ids, pos = mb.input_ids_BL[k], mb.position_ids_BL[k]
        assert int(ids[at]) == int(row.ids[j])  # the token before, fed at that position
        assert int(pos[at]) == j  # at the row's own position
        seen = mb.attention_mask_BL[k, 0, at].nonzero()[:, 0]
        view = sorted(zip(pos[seen].tolist(), ids[seen].tolist(), strict=True))
        assert view == list(enumerate(row.ids[: j + 1].tolist()))


def test_micro_batches_keep_groups_whole_within_the_budget():
    rows = group_rows(
        [([1] * 4, [[2] * 3] * 4), ([1] * 2, [[2]] * 2), ([1] * 10, [[2] * 5] * 4)]
    )  # sequence lengths 16, 4, 30
    plan = SP.plan(rows, token_budget=32)
    assert plan == [[4, 5, 0, 1, 2, 3], [6, 7, 8, 9]]  # 2 x 16 <= 32; 30 alone
    assert sorted(i for part in plan for i in part) == list(range(len(rows)))


def test_it_pays_for_short_completions_of_a_shared_prompt_and_not_for_long_ones():
    real = group_rows([([1] * 44, [[2] * 8] * 4)] * 8)  # docs/real_model's task
    assert SP.worth_it(real, SMOLLM2)
    distinct = group_rows([([k + 3] * 44, [[2] * 8]) for k in range(8)])  # G = 1, nothing shared
    assert not SP.worth_it(distinct, SMOLLM2)
    long = group_rows([([1] * 64, [[2] * 1000] * 4)])  # the square of 4 x 1000 tokens
    assert not SP.worth_it(long, SMOLLM2)
    too_long = group_rows([([1] * 100, [[2] * 1100] * 4)])
    assert SP.group_lengths(too_long) == [4500]
    assert not SP.worth_it(too_long, SMOLLM2)


def test_the_positions_saved_on_the_real_task():
    rows = group_rows([([1] * 44, [[2] * 8] * 4)])
    assert SP.group_lengths(rows) == [44 + 32]
    assert sum(len(r.ids) for r in rows) == 4 * 52  # 2.7x the positions, padded


@pytest.mark.parametrize(
    ("config", "full"),
    [
        (SimpleNamespace(), True),
        (SimpleNamespace(sliding_window=4096, use_sliding_window=False), True),
        (SimpleNamespace(sliding_window=4096, use_sliding_window=True), False),
        (SimpleNamespace(sliding_window=4096), False),
        (SimpleNamespace(layer_types=["full_attention"] * 2), True),
        (SimpleNamespace(layer_types=["full_attention", "sliding_attention"]), False),
    ],
)
def test_only_full_attention_models_take_the_layout(config, full):
    assert SP.full_attention_only(config) == full
