"""The kept set of truncated sampling: its definition, a brute-force reference, its encoding.

With top-k, top-p or min-p on, the engine samples a token `a` from the renormalised
distribution over the kept set K, q(a) = p(a) / S with S = Σ_{k∈K} p(k), not from p. A learner
that takes a full-vocabulary log-softmax gets log p(a) = log q(a) + log S: every importance
ratio carries the factor S, which is no policy change. So the engine records K for every
sampled token and the learner renormalises over it (consumer/train/lm_head.py):

    log π_K(a) = log π(a) - logsumexp_{k∈K} log π(k)        (both at the sampling temperature)

The learner never recomputes K: it uses what the engine recorded (vLLM's own K depends on its
kernel: ties, approximate top-p pivots), so the ratio is exact whatever the engine's rule was.

Owns: the truncation settings (`Truncation`), the rule our own sampler applies (stated here;
computed batched in torch by `common.sampling.logprobs.truncated_logits`, checked against
`reference_kept_set`, a per-token brute force in float64), and the compact encoding of the kept
sets of a run of tokens (`KeptSets`: offsets + ids), its checks (`encoding_problem`) and its
concatenation. Imports numpy only (no torch): the wire and the fake engine use it.

The rule (vLLM 0.24's order; z = logits / T in float32; V the vocabulary):
 1. min_p > 0: drop i where z_i < max z + log(min_p)          (i.e. p_i < min_p · p_max)
 2. top-k, k = min(top_k or V, max_kept): t = the k-th largest remaining z; drop z_i < t (ties
    at t kept, as vLLM's sort-based top-k does), and keep at most `max_kept` tokens: with the
    order (z descending, id ascending), drop every token ranked max_kept or later (so a tie
    group at t that would overflow max_kept is cut at its lowest ids);
 3. top_p < 1: p = softmax of the remaining z; keep i iff the mass of the remaining tokens
    with a strictly larger z is < top_p (a tie group is kept or dropped whole; the token that
    crosses top_p is kept, so the most probable token always is);
 4. K = the tokens left; a = argmax_{k∈K}(z_k + Gumbel_k); log q(a) = z_a - logsumexp_K z.
With every truncation off (top_k 0, top_p 1, min_p 0) nothing is dropped, no kept set is
recorded and max_kept plays no part: K is the vocabulary.

Encoding (`KeptSets`, one per completion, concatenated per group on the wire): for L tokens,
`offsets` int32 [L + 1] (offsets[0] = 0, non-decreasing) and `ids` int32 [offsets[L]]: token t's
kept ids OTHER than the sampled token itself, ascending, at ids[offsets[t]:offsets[t + 1]]; so
K_t = {token_t} ∪ that slice and |K_t| = 1 + offsets[t + 1] - offsets[t]. `unknown` int32 [U],
ascending token indices whose kept set the engine could not record exactly (vLLM: more
candidates than it reported, or a sampled token without a finite processed log-prob); their
slice is empty and they are never trained (the learner masks them and counts them). An
untruncated completion has all three empty.

On the wire the offsets travel as their differences, one byte per token (`other_counts`:
|K_t| - 1, uint8, so max_kept <= `MAX_KEPT_WIRE` = 256), and `from_counts` rebuilds them: with
the sampled id left out (always in K), a token costs 1 byte beyond its own id and log-prob, and
each further kept id 4 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

I32 = np.int32
_I32_MAX = (1 << 31) - 1
MAX_KEPT_WIRE = 256  # the wire carries |K_t| - 1 in one byte (`other_counts`)


@dataclass(frozen=True, slots=True)
class Truncation:
    """The truncation of one run's sampling (`sampling.top_k/top_p/min_p/max_kept`).

    0 = off for `top_k` and `min_p`, 1 = off for `top_p`. `max_kept` bounds every kept set
    whenever any truncation is on (see the module doc, rule 2)."""

    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_kept: int = 256

    def __post_init__(self) -> None:
        assert self.top_k >= 0, self  # the config refuses these with a message naming the key
        assert 0 < self.top_p <= 1, self
        assert 0 <= self.min_p < 1, self
        assert self.max_kept >= 1, self

    @property
    def active(self) -> bool:
        """Whether anything is dropped at all (else K is the whole vocabulary)."""
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0

    def k_bound(self, vocab_size: int) -> int:
        """k of rule 2: min(top_k or V, max_kept, V); V when no truncation is on."""
        if not self.active:
            return vocab_size
        return min(self.top_k or vocab_size, self.max_kept, vocab_size)


NO_TRUNCATION = Truncation()


# ---------------------------------------------------------------------------------------------
# The reference: the rule above, one token at a time, in float64 (tests check the batched torch
# version, common.sampling.logprobs.truncated_logits, against it)


def reference_kept_set(
    logits_V: Sequence[float] | np.ndarray, truncation: Truncation, *, temperature: float
) -> np.ndarray:
    """The ids of K for one position's logits (ascending), by the rule of the module doc.

    z is computed as the sampler does (float32 logits / T, in float32), every decision after
    that in float64 by explicit comparisons over all tokens."""
    z32 = np.asarray(logits_V, np.float32) / np.float32(temperature)
    z = z32.astype(np.float64)
    vocab = len(z)
    alive = np.isfinite(z)
    if not truncation.active:
        return np.flatnonzero(alive)
    if truncation.min_p > 0:
        top = z[alive].max()
        alive &= ~(z < top + math.log(truncation.min_p))
    k = truncation.k_bound(vocab)
    order = sorted(range(vocab), key=lambda i: (-z[i] if alive[i] else math.inf, i))
    if k < vocab:
        live = [i for i in order if alive[i]]
        if len(live) >= k:
            kth = z[live[k - 1]]
            alive &= ~(z < kth)
    rank = np.empty(vocab, np.int64)
    rank[order] = np.arange(vocab)
    alive &= rank < truncation.max_kept
    if truncation.top_p < 1:
        p = np.where(alive, np.exp(z - z[alive].max()), 0.0)
        p /= p.sum()
        mass_above = np.array([p[alive & (z > z[i])].sum() for i in range(vocab)])
        alive &= mass_above < truncation.top_p
    return np.flatnonzero(alive)


def reference_log_q(
    logits_V: Sequence[float] | np.ndarray, kept: np.ndarray, token: int, *, temperature: float
) -> float:
    """log q(token) over the kept ids `kept`, in float64: z_a - logsumexp_K z."""
    z = np.asarray(logits_V, np.float32).astype(np.float64) / float(np.float32(temperature))
    zk = z[np.asarray(kept)]
    top = zk.max()
    return float(z[token] - (top + math.log(np.exp(zk - top).sum())))


# ---------------------------------------------------------------------------------------------
# The encoding


def _empty() -> np.ndarray:
    return np.zeros(0, I32)


@dataclass(frozen=True, slots=True, eq=False)
class KeptSets:
    """The kept sets of a run of L tokens (see the module doc); all empty when untruncated."""

    offsets: np.ndarray = field(default_factory=_empty)  # int32 [L + 1], or [0]
    ids: np.ndarray = field(default_factory=_empty)  # int32 [offsets[-1]]: the other kept ids
    unknown: np.ndarray = field(default_factory=_empty)  # int32 [U]: untrainable tokens

    @property
    def present(self) -> bool:
        return len(self.offsets) > 0

    def sizes(self) -> np.ndarray:
        """|K_t| per token (int64 [L]; 0 for an unknown token)."""
        out = np.diff(self.offsets.astype(np.int64)) + 1
        out[self.unknown] = 0
        return out

    def trained(self, length: int) -> np.ndarray:
        """bool [length]: the tokens whose kept set is known (all of an untruncated run)."""
        out = np.ones(length, bool)
        out[self.unknown] = False
        return out

    def other_counts(self) -> np.ndarray:
        """uint8 [L]: per token, its kept ids other than itself (|K_t| - 1; 0 for an unknown
        token): the offsets' wire form (`from_counts` inverts it). Needs sets <= MAX_KEPT_WIRE."""
        counts = np.diff(self.offsets)
        assert not len(counts) or int(counts.max()) < MAX_KEPT_WIRE, "a kept set > MAX_KEPT_WIRE"
        return counts.astype(np.uint8)

    def slice(self, start: int, stop: int) -> KeptSets:
        """The kept sets of tokens [start, stop), offsets rebased to 0 (views where possible)."""
        if not self.present:
            return self
        offsets = self.offsets[start : stop + 1]
        base = int(offsets[0])
        unknown = self.unknown
        if len(unknown):
            unknown = (unknown[(unknown >= start) & (unknown < stop)] - start).astype(I32)
        return KeptSets(offsets - base, self.ids[base : int(offsets[-1])], unknown)


def from_counts(counts: np.ndarray, ids: np.ndarray, unknown: np.ndarray) -> KeptSets:
    """The kept sets whose wire form is `counts` (uint8 [L], `KeptSets.other_counts`), `ids`
    and `unknown`: offsets int32 [L + 1] by a running sum (the one array this builds; empty
    counts = no kept sets). Counts that do not sum to len(ids) give offsets that
    `encoding_problem` refuses; the sum cannot overflow int32 before that is seen, as it is
    taken only when it is len(ids) (<= 2**31 - 1)."""
    if not len(counts):
        return KeptSets(_empty(), ids, unknown)
    offsets = np.zeros(len(counts) + 1, I32)
    if int(counts.sum(dtype=np.int64)) == len(ids):
        np.cumsum(counts, dtype=I32, out=offsets[1:])
    else:
        offsets[-1] = -1  # refused below: the last offset must be len(ids)
    return KeptSets(offsets, ids, unknown)


def from_lists(others: Sequence[np.ndarray], unknown: Sequence[int] = ()) -> KeptSets:
    """The encoding of per-token arrays of other kept ids (each ascending, without the token)."""
    sizes = np.fromiter((len(o) for o in others), np.int64, len(others))
    offsets = np.zeros(len(others) + 1, I32)
    offsets[1:] = np.cumsum(sizes)
    ids = np.concatenate([np.asarray(o, I32) for o in others]) if len(others) else _empty()
    return KeptSets(offsets, ids.astype(I32, copy=False), np.asarray(unknown, I32))


def concat(parts: Sequence[KeptSets], lengths: Sequence[int]) -> KeptSets:
    """One encoding of consecutive runs of tokens (`lengths[i]` tokens each): the group's."""
    if not parts or not parts[0].present:
        assert all(not p.present for p in parts), "kept sets on some completions only"
        return KeptSets()
    assert all(p.present for p in parts), "kept sets on some completions only"
    token_base = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    id_base = np.concatenate([[0], np.cumsum([len(p.ids) for p in parts])[:-1]]).astype(np.int64)
    offsets = np.concatenate(
        [[0]] + [p.offsets[1:].astype(np.int64) + b for p, b in zip(parts, id_base, strict=True)]
    )
    unknown = np.concatenate(
        [p.unknown.astype(np.int64) + b for p, b in zip(parts, token_base, strict=True)]
    )
    return KeptSets(
        offsets.astype(I32),
        np.concatenate([p.ids for p in parts]).astype(I32, copy=False),
        unknown.astype(I32),
    )


def encoding_problem(
    kept: KeptSets, tokens: np.ndarray, *, vocab_size: int | None, max_kept: int | None
) -> str | None:
    """What is wrong with the kept sets of `tokens` (int32 [L]), or None. Checks lengths,
    offsets, ids in [0, vocab), each set ascending and without its sampled token (so no id
    counts twice), |K| <= max_kept, and unknown tokens (ascending, in range, empty sets).

    Few passes (the decoder runs this on every group): a negative int32 read as uint32 is too
    large, so one max checks both bounds; ascending is the minimum of the ids' differences,
    those across two sets set aside. Temporaries: 5 bytes per kept id at most (the wire's
    allocation bound allows for them)."""
    offsets, ids, unknown = kept.offsets, kept.ids, kept.unknown
    if not kept.present:
        return None if len(ids) == 0 and len(unknown) == 0 else "kept ids without offsets"
    n = len(tokens)
    if len(offsets) != n + 1 or offsets[0] != 0 or int(offsets[-1]) != len(ids):
        return "kept sets: one count per token, the counts summing to len(kept_ids)"
    sizes = offsets[1:] - offsets[:-1]
    most = (max_kept - 1) if max_kept is not None else _I32_MAX
    if n and int(_unsigned(sizes).max()) > most:
        if int(sizes.min()) < 0:
            return "kept set offsets must not decrease"
        return f"a kept set of {int(sizes.max()) + 1} ids > max_kept {max_kept}"
    if len(ids):
        bound = vocab_size if vocab_size is not None else _I32_MAX + 1
        if int(_unsigned(ids).max()) >= bound:
            low, high = int(ids.min()), int(ids.max())
            return f"kept id {low if low < 0 else high} out of range"
        rise = ids[1:] - ids[:-1]  # in [-bound, bound]: no overflow once ids are in range
        starts = offsets[1:-1]  # non-decreasing from 0 to len(ids): those inside are a range
        inside = starts[np.searchsorted(starts, 0, "right") : np.searchsorted(starts, len(ids))]
        rise[inside - 1] = 1  # a set may start anywhere
        if len(rise) and int(rise.min()) <= 0:
            return "each kept set must be ascending, without repeats"
        del rise
        if (ids == np.repeat(tokens, sizes)).any():
            return "a kept set lists its sampled token again"
    if len(unknown):
        if int(unknown.min()) < 0 or int(unknown.max()) >= n or (np.diff(unknown) <= 0).any():
            return "kept_unknown must be ascending token indices"
        if sizes[unknown].any():
            return "a token whose kept set is unknown lists kept ids"
    return None


def _unsigned(a: np.ndarray) -> np.ndarray:
    """`a`'s integers read as unsigned of the same width (no copy): negatives become huge."""
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))
