"""The shared-prompt layout: a group's prompt runs through the decoder once, not G times.

The G completions of a group share their prompt, so the learner lays each group out as one
sequence, `prompt ++ completion_1 ++ ... ++ completion_G` (right-padded to the micro-batch's
longest group), with position ids that restart at the prompt's length for every completion and
a dense attention mask [K groups, 1, L, L] (SDPA) in which

    query q may attend key k  iff  k <= q  and  (k is a prompt token  or  k, q are tokens of
                                                  the same completion)

so each completion sees its prompt and its own earlier tokens, exactly as in its own row
(padding positions see the prompt and themselves: every query has a key, so no NaN reaches
the backward). The output that predicts completion token t of row b is the one at the
prompt's last position for t = 0 (shared by the G rows) and at the completion's token t - 1
otherwise: `hidden_index_N` points there, and the loss frame (consumer/train/batching.py) is
the padded layout's, row for row. Gradients flow through the shared prompt positions from all
G completions, which is the sum the G separate rows would give.

One sequence for the micro-batch (`one_sequence`): prompts of different groups usually begin
alike too (a chat template's system turn, the question's wording), so all the micro-batch's
groups go into one sequence: their common prefix once, then for each group the rest of its
prompt and its completions,

    common ++ rest_1 ++ completions of group 1 ++ rest_2 ++ completions of group 2 ++ ...

where a key is visible to a query iff `k <= q` and k is a common-prefix token, or both are of
the same group and k is of its prompt's rest or of the query's own completion; positions run
on from the common prefix through each group's rest into each of its completions. No padding.

What it saves: the decoder runs over `p + Σ c_i` positions per group instead of `G (p + c)`,
and in one sequence the common prefix once for all groups: on docs/real_model's task (8 groups,
44-token prompts sharing 29, G = 4, c <= 8) 405 positions instead of 1,664 rows' (608 group by
group), and the activations kept for the backward shrink alike. What it costs: dense attention
over the longer sequence, O(L²) instead of a sum of short squares. `cost` weighs both with the
model's shapes and `layout_for` takes the cheapest of the three (rows padded, a sequence per
group, one sequence) for a micro-batch, a shared layout only when clearly cheaper, so long
completions (where a prompt is a small share and the square grows with G) keep the padded rows.
Needs full attention in every layer (a sliding window is not in the mask) and SDPA.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class Row(Protocol):
    """What the layout reads of a row (consumer/train/batching.py `Row`)."""

    @property
    def ids(self) -> np.ndarray: ...  # prompt ++ completion
    @property
    def prompt_len(self) -> int: ...
    @property
    def group(self) -> int: ...  # rows of one group share their prompt


SAVING = 0.9  # the shared layout is taken when its cost is below this share of the rows'
MAX_LENGTH = 4096  # longest group sequence: its mask is L² bytes


@dataclass(frozen=True, slots=True)
class Shapes:
    """What the cost of a forward depends on: multiply-adds per position in a layer's linear
    maps, and per (query, key) pair in its attention (QK^T and the weighted values)."""

    linear_per_position: int
    attention_per_pair: int

    @staticmethod
    def of(config: Any) -> Shapes:
        """From a transformers config (Llama, Qwen2, Mistral and their kin)."""
        d = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        kv = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or d // heads)
        ff = int(getattr(config, "intermediate_size", None) or 4 * d)
        linear = 2 * d * heads * head_dim + 2 * d * kv * head_dim + 3 * d * ff
        return Shapes(linear, 2 * heads * head_dim)


def full_attention_only(config: Any) -> bool:
    """Whether every layer attends to every earlier position (the mask assumes it)."""
    kinds = getattr(config, "layer_types", None)
    if kinds is not None:
        return all(k == "full_attention" for k in kinds)
    window = getattr(config, "sliding_window", None)
    return window is None or not getattr(config, "use_sliding_window", True)


def group_lengths(rows: Sequence[Row]) -> list[int]:
    """The shared layout's sequence length of each group among `rows` (first-seen order)."""
    lengths: dict[int, int] = {}
    for r in rows:
        lengths[r.group] = lengths.get(r.group, r.prompt_len) + len(r.ids) - r.prompt_len
    return list(lengths.values())


def cost(lengths: list[int], shapes: Shapes) -> int:
    """Multiply-adds of one layer over sequences of `lengths`, padded to the longest."""
    if not lengths:
        return 0
    longest = max(lengths)
    per_sequence = longest * shapes.linear_per_position + longest**2 * shapes.attention_per_pair
    return len(lengths) * per_sequence


def one_length(rows: Sequence[Row]) -> int:
    """The one-sequence layout's length: the groups' common prompt prefix once, then each
    group's prompt rest and completions."""
    prompts = {r.group: r.ids[: r.prompt_len] for r in rows}
    common = _common_length(list(prompts.values()))
    return (
        common
        + sum(len(p) - common for p in prompts.values())
        + sum(len(r.ids) - r.prompt_len for r in rows)
    )


def layout_for(rows: Sequence[Row], shapes: Shapes) -> str | None:
    """The cheapest layout of these rows (whole groups): "one" (one sequence), "groups" (a
    sequence per group), or None (rows padded) unless a shared one is clearly cheaper."""
    if not rows:
        return None
    options = {"groups": group_lengths(rows), "one": [one_length(rows)]}
    costs = {k: cost(v, shapes) for k, v in options.items() if max(v) <= MAX_LENGTH}
    if not costs:
        return None
    best = min(costs, key=lambda k: (costs[k], k != "one"))
    rows_cost = cost([len(r.ids) for r in rows], shapes)
    return best if costs[best] < SAVING * rows_cost else None


def worth_it(rows: Sequence[Row], shapes: Shapes) -> bool:
    """Whether these rows (whole groups) cost clearly less in a shared layout than padded."""
    return layout_for(rows, shapes) is not None


def _common_length(prompts: Sequence[np.ndarray]) -> int:
    """Tokens every one of `prompts` starts with."""
    n = min(len(p) for p in prompts)
    first = prompts[0][:n]
    for p in prompts[1:]:
        differ = np.flatnonzero(p[:n] != first)
        n = int(differ[0]) if len(differ) else n
        first = first[:n]
    return n


def plan(rows: Sequence[Row], token_budget: int) -> list[list[int]]:
    """Micro-batches of whole groups: groups by increasing sequence length, filled while
    `groups * longest <= token_budget` (a longer group alone); row indices, a group's rows
    together in their order."""
    members: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        members.setdefault(r.group, []).append(i)
    keys = list(members)
    lengths = dict(zip(keys, group_lengths(rows), strict=True))
    out: list[list[int]] = []
    current: list[int] = []
    count = 0
    for key in sorted(keys, key=lambda k: (lengths[k], k)):
        if count and (count + 1) * lengths[key] > token_budget:
            out.append(current)
            current, count = [], 0
        current += members[key]
        count += 1
    if current:
        out.append(current)
    return out


@dataclass(frozen=True, slots=True)
class Inputs:
    """The decoder's inputs in the shared layout (numpy; the caller moves them to torch)."""

    input_ids_KL: np.ndarray  # int64 [K, L]
    position_ids_KL: np.ndarray  # int64 [K, L]
    mask_KLL: np.ndarray  # bool [K, L, L]: query, key
    hidden_index_N: np.ndarray  # int64 [N], flat index into the K * L outputs
    num_real: int  # positions that are not padding


def inputs(picked: Sequence[Row], row_N: np.ndarray, pos_N: np.ndarray, *, pad_id: int) -> Inputs:
    """Lay out `picked` (the micro-batch's rows, in loss-frame order) group by group; `row_N`,
    `pos_N` are the loss frame's trained positions (row, shifted position) in mask order."""
    slot: dict[int, int] = {}  # group -> its sequence
    for r in picked:
        slot.setdefault(r.group, len(slot))
    K = len(slot)
    prompt = [0] * K
    used = [0] * K
    offset = np.zeros(len(picked), np.int64)  # where each row's completion starts
    for b, r in enumerate(picked):
        k = slot[r.group]
        if used[k] == 0:
            prompt[k] = used[k] = r.prompt_len
        assert r.prompt_len == prompt[k], "rows of one group share their prompt"
        offset[b] = used[k]
        used[k] += len(r.ids) - r.prompt_len
    L = max(used)
    ids = np.full((K, L), pad_id, np.int64)
    positions = np.zeros((K, L), np.int64)
    segment = np.full((K, L), -2, np.int64)  # -1 prompt, b completion of row b, -2 padding
    done = [False] * K
    for b, r in enumerate(picked):
        k, p = slot[r.group], r.prompt_len
        if not done[k]:
            ids[k, :p] = r.ids[:p]
            positions[k, :p] = np.arange(p)
            segment[k, :p] = -1
            done[k] = True
        else:
            assert np.array_equal(ids[k, :p], r.ids[:p]), "rows of one group share their prompt"
        c, start = len(r.ids) - p, int(offset[b])
        ids[k, start : start + c] = r.ids[p:]
        positions[k, start : start + c] = np.arange(p, p + c)
        segment[k, start : start + c] = b
    causal = np.tri(L, dtype=bool)[None]
    mask = causal & ((segment[:, None, :] == -1) | (segment[:, None, :] == segment[:, :, None]))
    rows_k = np.array([slot[r.group] for r in picked], np.int64)
    prompts = np.array([r.prompt_len for r in picked], np.int64)
    t = pos_N + 1 - prompts[row_N]  # the completion token each trained position predicts
    at = np.where(t == 0, prompts[row_N] - 1, offset[row_N] + t - 1)
    return Inputs(ids, positions, mask, rows_k[row_N] * L + at, int(sum(used)))


def one_sequence(
    picked: Sequence[Row], row_N: np.ndarray, pos_N: np.ndarray, *, pad_id: int
) -> Inputs:
    """Lay out `picked` (whole groups, loss-frame order) as one sequence (module docstring);
    `row_N`, `pos_N` as for `inputs`."""
    order: dict[int, list[int]] = {}  # group -> its rows, in loss-frame order
    for b, r in enumerate(picked):
        order.setdefault(r.group, []).append(b)
    prompts = {g: picked[rows[0]].ids[: picked[rows[0]].prompt_len] for g, rows in order.items()}
    common = _common_length(list(prompts.values()))
    # per position: token, position id, kind (0 common prefix, 1 prompt rest, 2 completion),
    # group, row (of a completion)
    ids: list[int] = []
    positions: list[int] = []
    kind: list[int] = []
    group: list[int] = []
    row: list[int] = []
    last = np.zeros(len(picked), np.int64)  # where each row's prompt ends (its last position)
    start = np.zeros(len(picked), np.int64)  # where each row's completion begins

    def put(tokens: np.ndarray, first: int, k: int, g: int, b: int) -> None:
        ids.extend(tokens.tolist())
        positions.extend(range(first, first + len(tokens)))
        kind.extend([k] * len(tokens))
        group.extend([g] * len(tokens))
        row.extend([b] * len(tokens))

    put(prompts[next(iter(order))][:common], 0, 0, -1, -1)
    for g, rows in order.items():
        prompt = prompts[g]
        put(prompt[common:], common, 1, g, -1)
        end = len(ids) - 1 if len(prompt) > common else common - 1  # the prompt's last token
        for b in rows:
            r = picked[b]
            assert np.array_equal(r.ids[: r.prompt_len], prompt), "a group shares its prompt"
            last[b], start[b] = end, len(ids)
            put(r.ids[r.prompt_len :], r.prompt_len, 2, g, b)
    L = len(ids)
    k_kind, k_group, k_row = np.array(kind), np.array(group), np.array(row)
    sees = (k_kind[None, :] == 0) | (
        (k_group[None, :] == k_group[:, None])
        & ((k_kind[None, :] == 1) | (k_row[None, :] == k_row[:, None]))
    )
    mask = np.tri(L, dtype=bool) & sees
    prompt_len = np.array([r.prompt_len for r in picked], np.int64)
    t = pos_N + 1 - prompt_len[row_N]  # the completion token each trained position predicts
    at = np.where(t == 0, last[row_N], start[row_N] + t - 1)
    return Inputs(
        np.array(ids, np.int64)[None], np.array(positions, np.int64)[None], mask[None], at, L
    )
