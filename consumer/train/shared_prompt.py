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

What it saves: the decoder runs over `p + Σ c_i` positions per group instead of
`G (p + c)`: on docs/real_model's task (p = 44, G = 4, c <= 8) 2.8x fewer positions, and the
activations kept for the backward shrink alike. What it costs: dense attention over the longer
sequence, O(L²) per group instead of G O((p + c)²). `cost` weighs both with the model's shapes
and `worth_it` takes the layout for a micro-batch only when it is clearly cheaper, so long
completions (where a prompt is a small share and the square grows with G) keep the padded
rows. Needs full attention in every layer (a sliding window is not in the mask) and SDPA.
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


def worth_it(rows: Sequence[Row], shapes: Shapes) -> bool:
    """Whether these rows (whole groups) cost clearly less in the shared layout than padded."""
    grouped = group_lengths(rows)
    if not grouped or max(grouped) > MAX_LENGTH or len(grouped) == len(rows):
        return False
    return cost(grouped, shapes) < SAVING * cost([len(r.ids) for r in rows], shapes)


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
