"""From admitted groups to micro-batches, padded or packed (pure data processing; torch only to
collate).

Layout of one row: `ids = prompt_ids ++ completion_ids` (length L_b). The model's output at
position j predicts token j + 1, so the loss works in the shifted frame of T = max L_b - 1
positions, the same in both layouts: `tokens_BT[b, j] = ids_b[j + 1]`, and `mask_BT[b, j] = 1`
iff token j + 1 is a completion token of row b. `behavior_logp_BT` holds each completion token's
behaviour log-prob at that position (0 elsewhere). The N completion tokens in row-major order of
`mask_BT` are `tokens_N`; `hidden_index_N[n]` is the flat index, into the model's output positions
(`input_ids_BL.numel()` of them), of the position that predicts token n. The learner applies the
LM head only there (consumer/train/lm_head.py) and scatters the N log-probs back into the frame.

Model inputs, two layouts:
- padded: rows right-padded to [B, L]; positions 0..L_b - 1 for real tokens. `attention_mask_BL`
  hides the padding, and is None when every row has the same length (causal attention alone is
  exact then, and SDPA keeps its flash kernel).
- packed (padding-free): the rows concatenated into one sequence [1, S], S = Σ L_b, with
  `position_ids_BL` restarting at 0 for each row and `cu_seqlens` (int32 [B + 1]) marking the row
  boundaries, so that varlen / document-masked attention keeps each row to itself.

Micro-batches: padded, rows sorted by length and filled greedily so that
`rows_in_micro_batch * longest_row <= token_budget` (padded tokens, which is what memory scales
with); packed, by real tokens, `Σ L_b <= token_budget`, first-fit over rows in decreasing length.
A row longer than the budget gets a micro-batch of its own. The loss is exact regardless of the
split because it uses global normalisers (`loss_normalisers`, consumer/train/loss.py
`aggregate(..., global_tokens=, global_seqs=)`): a data-parallel learner passes the counts of
the whole batch to every rank.

Episodes (multi-turn, producer/episodes/): a row's completion is a whole episode, the model's
turns and the environment's tokens between them; `Row.sampled` says which tokens the model
sampled. Only those are on the mask: an inserted token is never trained, carries no behaviour
log-prob (0 in `behavior_logp_BT`) and is not counted by the normalisers. The forward runs over
the whole episode, inserted tokens included (they are context for the turns after them). An
episode its environment failed (finish reason `env_error`) has no row at all (`rows_of`): its
group's advantages are computed without it (consumer/train/advantages.py, `valid_NG`).

Truncated sampling: each row carries its completion's kept sets (`Row.kept`,
common/sampling/kept_set.py). A token whose kept set the engine could not record (`kept.unknown`) is
off the mask: never trained, not counted by the normalisers. The micro-batch lays the N trained
tokens' sets out for the LM head as `kept_NK` (int64 [N, K], K = the largest set of the micro-batch,
at most max_kept: column 0 the token itself, then its other kept ids) and `kept_valid_NK` (bool,
False at padding entries); both None when the rows carry no kept sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from common.sampling.kept_set import KeptSets
from common.wire import Group
from consumer.train import shared_prompt as SP

ENV_ERROR = "env_error"  # an episode its environment failed: never trained


@dataclass(frozen=True, slots=True, eq=False)
class Row:
    ids: np.ndarray  # int32 [L]
    prompt_len: int
    behavior_logp: np.ndarray  # float32 [S]: the sampled completion tokens' (S = L - prompt_len
    # unless `sampled` says otherwise)
    advantage: float
    group: int  # index of the group in the batch
    kept: KeptSets = field(default_factory=KeptSets)  # the sampled tokens' kept sets, or empty
    sampled: np.ndarray | None = None  # bool [L - prompt_len]: an episode's sampled tokens

    @property
    def num_trained(self) -> int:
        """Completion tokens that count in the loss: sampled, their kept set known."""
        return len(self.behavior_logp) - len(self.kept.unknown)

    def sampled_positions(self) -> np.ndarray:
        """int64 [S]: the sampled tokens' positions in the completion (0 = its first token)."""
        if self.sampled is None:
            return np.arange(len(self.ids) - self.prompt_len)
        return np.flatnonzero(self.sampled)


@dataclass(frozen=True, slots=True, eq=False)
class MicroBatch:
    # -- model inputs (see the module docstring for the two layouts) ---------------------------
    input_ids_BL: torch.Tensor  # int64: padded [B, L] (right-padded with pad_id) | packed [1, S]
    # | shared prompt [K groups, L] (consumer/train/shared_prompt.py)
    attention_mask_BL: torch.Tensor | None  # int64 [B, L], 1 = real token; padded, unequal rows
    # | bool [K, 1, L, L] (query, key) in the shared-prompt layout
    position_ids_BL: torch.Tensor | None  # int64 [1, S], 0.. per row (packed) | [K, L] (shared)
    cu_seqlens: torch.Tensor | None  # int32 [B + 1], row starts in the packed sequence, then S
    max_seqlen: int  # longest row
    hidden_index_N: torch.Tensor  # int64 [N], flat output position predicting each token
    tokens_N: torch.Tensor  # int64 [N], the completion tokens in row-major mask order
    # -- the loss frame [B, T], T = max L - 1 (identical in both layouts) ----------------------
    tokens_BT: torch.Tensor  # int64
    mask_BT: torch.Tensor  # bool, completion positions
    behavior_logp_BT: torch.Tensor  # float32, 0 off the mask
    advantages_B: torch.Tensor  # float32
    rows: tuple[int, ...]  # indices into the batch's row list
    num_tokens: int  # N: completion tokens that are trained
    num_real: int  # model input positions that are not padding
    layout: str  # "padded" | "packed" | "shared_prompt"
    num_unknown: int = 0  # completion tokens left out: their kept set is unknown
    # -- kept sets of truncated sampling (None without): see the module docstring --------------
    kept_NK: torch.Tensor | None = None  # int64 [N, K]: the token, then its other kept ids
    kept_valid_NK: torch.Tensor | None = None  # bool [N, K]

    @property
    def kept(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(kept_NK, kept_valid_NK), or None without kept sets."""
        if self.kept_NK is None:
            return None
        assert self.kept_valid_NK is not None
        return self.kept_NK, self.kept_valid_NK

    @property
    def packed(self) -> bool:
        return self.layout == "packed"

    @property
    def num_positions(self) -> int:
        """Positions the model runs over, padding included."""
        return self.input_ids_BL.numel()


def rows_of(
    groups: list[Group], advantages_NG: np.ndarray, *, all_episodes: bool = False
) -> list[Row]:
    """One row per completion, in group order; `advantages_NG[n, i]` belongs to completion i.
    An episode its environment failed has none, unless `all_episodes` (log-probs to compare)."""
    rows = []
    for n, g in enumerate(groups):
        for i in range(g.group_size):
            if g.finish_reasons[i] == ENV_ERROR and not all_episodes:
                continue
            ids, logp = g.completion(i)
            rows.append(
                Row(
                    ids=np.concatenate([g.prompt_ids, ids]).astype(np.int32),
                    prompt_len=len(g.prompt_ids),
                    behavior_logp=np.asarray(logp, np.float32),
                    advantage=float(advantages_NG[n, i]),
                    group=n,
                    kept=g.completion_kept(i),
                    sampled=g.completion_sampled(i) if g.episodes else None,
                )
            )
    return rows


def trained_NG(groups: list[Group]) -> np.ndarray:
    """bool [N, G]: the completions that may be trained (all but episodes their environment
    failed)."""
    return np.array([[r != ENV_ERROR for r in g.finish_reasons] for g in groups], bool)


def loss_normalisers(rows: list[Row]) -> tuple[int, int]:
    """(global_tokens, global_seqs) of the loss over these rows: trained completion tokens and
    rows."""
    return sum(r.num_trained for r in rows), len(rows)


def split_by_tokens(lengths: list[int], parts: int) -> list[int]:
    """The part (data-parallel rank) of each row, balancing tokens: rows in decreasing length
    (ties by index) each go to the part with the fewest tokens so far (ties: the lowest part).
    Deterministic, so every rank computes the same split from the same rows."""
    loads = [0] * parts
    owner = [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        k = min(range(parts), key=lambda k: (loads[k], k))
        owner[i] = k
        loads[k] += lengths[i]
    return owner


def plan_micro_batches(
    lengths: list[int], token_budget: int, *, packed: bool = False
) -> list[list[int]]:
    """Partition row indices into micro-batches: padded, rows * max_len <= token_budget; packed,
    sum of lengths <= token_budget (a longer row alone either way)."""
    if packed:
        return _plan_packed(lengths, token_budget)
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


def _plan_packed(lengths: list[int], token_budget: int) -> list[list[int]]:
    """First-fit decreasing by real tokens: few micro-batches, each within the budget."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    used: list[int] = []
    for i in order:
        for k, total in enumerate(used):
            if total + lengths[i] <= token_budget:
                out[k].append(i)
                used[k] += lengths[i]
                break
        else:
            out.append([i])
            used.append(lengths[i])
    return out


def collate(
    rows: list[Row],
    indices: list[int],
    *,
    pad_id: int,
    device: torch.device,
    packed: bool = False,
    shared_prompt: bool = False,
    one_sequence: bool = False,
) -> MicroBatch:
    """The rows `indices` as one micro-batch in the padded, the packed or the shared-prompt
    layout (consumer/train/shared_prompt.py: whole groups; a sequence per group, or with
    `one_sequence` all of them in one)."""
    assert not (packed and shared_prompt)
    picked = [rows[i] for i in indices]
    lengths = np.array([len(r.ids) for r in picked], np.int64)
    L = int(lengths.max())
    B = len(picked)
    tokens = np.full((B, L - 1), pad_id, np.int64)
    mask = np.zeros((B, L - 1), bool)
    behavior = np.zeros((B, L - 1), np.float32)
    for b, r in enumerate(picked):
        n = len(r.ids)
        tokens[b, : n - 1] = r.ids[1:]
        start = r.prompt_len - 1  # shifted position of the first completion token
        at = start + r.sampled_positions()  # an episode's inserted tokens stay off the mask
        mask[b, at] = True
        if len(r.kept.unknown):
            mask[b, at[r.kept.unknown]] = False  # kept set unknown: never trained
        behavior[b, at] = r.behavior_logp
    row_N, pos_N = np.nonzero(mask)  # row-major: the order of tokens_BT[mask_BT]
    kept_NK, valid_NK = _kept_layout(picked, tokens[mask])
    layout = "shared_prompt" if shared_prompt else "packed" if packed else "padded"
    inputs = _model_inputs(
        picked, lengths, row_N, pos_N, pad_id=pad_id, layout=layout, one_sequence=one_sequence
    )

    def on_device(a: np.ndarray | None) -> torch.Tensor | None:
        return None if a is None else torch.from_numpy(a).to(device)

    return MicroBatch(
        input_ids_BL=torch.from_numpy(inputs.ids).to(device),
        attention_mask_BL=on_device(inputs.attention_mask),
        position_ids_BL=on_device(inputs.position_ids),
        cu_seqlens=on_device(inputs.cu_seqlens),
        max_seqlen=L,
        hidden_index_N=torch.from_numpy(inputs.hidden_index.astype(np.int64)).to(device),
        tokens_N=torch.from_numpy(tokens[mask]).to(device),
        tokens_BT=torch.from_numpy(tokens).to(device),
        mask_BT=torch.from_numpy(mask).to(device),
        behavior_logp_BT=torch.from_numpy(behavior).to(device),
        advantages_B=torch.tensor(
            [r.advantage for r in picked], dtype=torch.float32, device=device
        ),
        rows=tuple(indices),
        num_tokens=int(mask.sum()),
        num_real=inputs.num_real,
        layout=layout,
        num_unknown=sum(len(r.kept.unknown) for r in picked),
        kept_NK=None if kept_NK is None else torch.from_numpy(kept_NK).to(device),
        kept_valid_NK=None if valid_NK is None else torch.from_numpy(valid_NK).to(device),
    )


@dataclass(frozen=True, slots=True)
class _Inputs:
    ids: np.ndarray  # int64
    attention_mask: np.ndarray | None
    position_ids: np.ndarray | None
    cu_seqlens: np.ndarray | None  # int32
    hidden_index: np.ndarray
    num_real: int


def _model_inputs(
    picked: list[Row],
    lengths: np.ndarray,
    row_N: np.ndarray,
    pos_N: np.ndarray,
    *,
    pad_id: int,
    layout: str,
    one_sequence: bool = False,
) -> _Inputs:
    """The decoder's inputs for `picked` in `layout` (see the module docstring), and where the
    output predicting each trained token (`row_N`, `pos_N` in the loss frame) is."""
    if layout == "shared_prompt":
        lay = SP.one_sequence if one_sequence else SP.inputs
        laid = lay(picked, row_N, pos_N, pad_id=pad_id)
        return _Inputs(
            ids=laid.input_ids_KL,
            attention_mask=laid.mask_KLL[:, None],
            position_ids=laid.position_ids_KL,
            cu_seqlens=None,
            hidden_index=laid.hidden_index_N,
            num_real=laid.num_real,
        )
    starts = np.concatenate([[0], np.cumsum(lengths)])
    if layout == "packed":
        ids = np.concatenate([r.ids for r in picked]).astype(np.int64)[None]
        positions = np.concatenate([np.arange(n) for n in lengths])[None]
        cu = starts.astype(np.int32)
        return _Inputs(ids, None, positions, cu, starts[row_N] + pos_N, int(lengths.sum()))
    L = int(lengths.max())
    ids = np.full((len(picked), L), pad_id, np.int64)
    for b, r in enumerate(picked):
        ids[b, : len(r.ids)] = r.ids
    mask = None
    if (lengths != L).any():
        mask = (np.arange(L)[None] < lengths[:, None]).astype(np.int64)
    return _Inputs(ids, mask, None, None, row_N * L + pos_N, int(lengths.sum()))


def _kept_layout(
    rows: list[Row], tokens_N: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """(kept_NK, valid_NK) of the trained tokens of `rows`, in mask order (see the module doc);
    (None, None) when the rows carry no kept sets."""
    if not rows or not rows[0].kept.present:
        assert all(not r.kept.present for r in rows), "kept sets on some rows only"
        return None, None
    sizes = np.concatenate([r.kept.offsets[1:] - r.kept.offsets[:-1] for r in rows])
    if any(len(r.kept.unknown) for r in rows):  # an unknown token is not in the mask
        sizes = sizes[np.concatenate([r.kept.trained(len(r.behavior_logp)) for r in rows])]
    ids = np.concatenate([r.kept.ids for r in rows])  # an unknown token lists none
    n = len(tokens_N)
    assert len(sizes) == n
    width = 1 + (int(sizes.max()) if n else 0)
    valid_NK = np.arange(width)[None, :] <= sizes[:, None]  # row-major: the ids' order
    kept_NK = np.zeros((n, width), np.int64)
    kept_NK[:, 0] = tokens_N
    others = valid_NK.copy()
    others[:, 0] = False
    kept_NK[others] = ids
    return kept_NK, valid_NK
