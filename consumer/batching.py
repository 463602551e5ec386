"""From admitted groups to padded micro-batches (pure data processing; torch only to collate).

Layout of one row: `ids = prompt_ids ++ completion_ids` (length L_b). The model's logits at
position j predict token j + 1, so the learner works in the shifted space of T = L - 1 positions:
`tokens_BT = ids[:, 1:]`, and `mask_BT[b, j] = 1` iff token j + 1 is a completion token of row b.
`behavior_logp_BT` holds each completion token's behaviour log-prob at that position (0 elsewhere).

Micro-batches: rows are sorted by length and packed greedily so that
`rows_in_micro_batch * longest_row <= token_budget` (padded tokens, which is what memory scales
with); a row longer than the budget gets a micro-batch of its own. Sorting by length keeps padding
small; the loss is exact regardless of the split because it uses global normalisers
(consumer/loss.py `aggregate(..., global_tokens=, global_seqs=)`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from common.wire import Group


@dataclass(frozen=True, slots=True, eq=False)
class Row:
    ids: np.ndarray  # int32 [L]
    prompt_len: int
    behavior_logp: np.ndarray  # float32 [L - prompt_len]
    advantage: float
    group: int  # index of the group in the batch


@dataclass(frozen=True, slots=True, eq=False)
class MicroBatch:
    input_ids_BL: torch.Tensor  # int64, right-padded with pad_id
    attention_mask_BL: torch.Tensor  # int64 (1 = real token)
    tokens_BT: torch.Tensor  # int64, T = L - 1
    mask_BT: torch.Tensor  # bool, completion positions
    behavior_logp_BT: torch.Tensor  # float32, 0 off the mask
    advantages_B: torch.Tensor  # float32
    rows: tuple[int, ...]  # indices into the batch's row list

    @property
    def num_tokens(self) -> int:
        return int(self.mask_BT.sum())


def rows_of(groups: list[Group], advantages_NG: np.ndarray) -> list[Row]:
    """One row per completion, in group order; `advantages_NG[n, i]` belongs to completion i."""
    rows = []
    for n, g in enumerate(groups):
        for i in range(g.group_size):
            ids, logp = g.completion(i)
            rows.append(
                Row(
                    ids=np.concatenate([g.prompt_ids, ids]).astype(np.int32),
                    prompt_len=len(g.prompt_ids),
                    behavior_logp=np.asarray(logp, np.float32),
                    advantage=float(advantages_NG[n, i]),
                    group=n,
                )
            )
    return rows


def plan_micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Partition row indices into micro-batches with rows * max_len <= token_budget."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    out: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[i]  # ascending order: the row joining is the longest
        if current and (len(current) + 1) * longest > token_budget:
            out.append(current)
            current = []
        current.append(i)
    if current:
        out.append(current)
    return out


def collate(
    rows: list[Row], indices: list[int], *, pad_id: int, device: torch.device
) -> MicroBatch:
    picked = [rows[i] for i in indices]
    L = max(len(r.ids) for r in picked)
    B = len(picked)
    ids = np.full((B, L), pad_id, np.int64)
    attn = np.zeros((B, L), np.int64)
    mask = np.zeros((B, L - 1), bool)
    behavior = np.zeros((B, L - 1), np.float32)
    for b, r in enumerate(picked):
        n = len(r.ids)
        ids[b, :n] = r.ids
        attn[b, :n] = 1
        start = r.prompt_len - 1  # shifted position of the first completion token
        mask[b, start : n - 1] = True
        behavior[b, start : n - 1] = r.behavior_logp
    input_ids = torch.from_numpy(ids).to(device)
    return MicroBatch(
        input_ids_BL=input_ids,
        attention_mask_BL=torch.from_numpy(attn).to(device),
        tokens_BT=input_ids[:, 1:],
        mask_BT=torch.from_numpy(mask).to(device),
        behavior_logp_BT=torch.from_numpy(behavior).to(device),
        advantages_B=torch.tensor(
            [r.advantage for r in picked], dtype=torch.float32, device=device
        ),
        rows=tuple(indices),
    )
