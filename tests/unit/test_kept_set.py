"""The kept set of truncated sampling (common/sampling/kept_set.py, common/sampling/logprobs.py):
the batched rule against the per-token brute force for every combination of temperature, top-k,
top-p, min-p and max_kept, the tie conventions, the learner's renormalised log-prob, and the
encoding."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from common.sampling import kept_set as ks
from common.sampling.kept_set import KeptSets, Truncation, reference_kept_set, reference_log_q
from common.sampling.logprobs import kept_set_logprobs, sampled_logprobs, truncated_logits

V = 23
TEMPERATURES = [0.7, 1.0, 1.6]
TOP_KS = [0, 1, 5, V]
TOP_PS = [1.0, 0.9, 0.5, 0.05]
MIN_PS = [0.0, 0.05, 0.4]
MAX_KEPTS = [256, 4]


def logit_rows(seed: int) -> np.ndarray:
    """Rows of logits: continuous, coarse (many exact ties), peaked, flat, with -inf entries."""
    rng = np.random.default_rng(seed)
    rows = [
        rng.normal(0, 2, V),
        np.round(rng.normal(0, 1.5, V) * 2) / 2,  # ties at every level
        np.concatenate([[8.0], rng.normal(0, 1, V - 1)]),  # one dominant token
        np.zeros(V),  # all tied
        np.where(rng.random(V) < 0.3, -np.inf, rng.normal(0, 2, V)),
    ]
    return np.stack(rows).astype(np.float32)


def kept_of(z_BV: torch.Tensor) -> list[np.ndarray]:
    return [np.flatnonzero(torch.isfinite(row).numpy()) for row in z_BV]


COMBOS = list(itertools.product(TEMPERATURES, TOP_KS, TOP_PS, MIN_PS, MAX_KEPTS))


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p", "max_kept"), COMBOS)
def test_the_batched_rule_keeps_exactly_the_reference_set_with_its_log_q(
    temperature, top_k, top_p, min_p, max_kept
):
    trunc = Truncation(top_k=top_k, top_p=top_p, min_p=min_p, max_kept=max_kept)
    logits = logit_rows(seed=top_k * 7 + int(top_p * 100) + int(min_p * 1000))
    z = truncated_logits(torch.from_numpy(logits), trunc, temperature=temperature)
    for row, got in zip(logits, kept_of(z), strict=True):
        want = reference_kept_set(row, trunc, temperature=temperature)
        np.testing.assert_array_equal(got, want)
        if trunc.active:
            assert 1 <= len(got) <= max_kept
    log_q_BV = torch.log_softmax(z, -1)
    for b, row in enumerate(logits):
        kept = np.flatnonzero(torch.isfinite(z[b]).numpy())
        for a in kept:
            ref = reference_log_q(row, kept, int(a), temperature=temperature)
            assert abs(float(log_q_BV[b, a]) - ref) < 1e-5


def test_without_truncation_the_rule_is_the_plain_tempered_logits():
    logits = torch.from_numpy(logit_rows(0))
    z = truncated_logits(logits, ks.NO_TRUNCATION, temperature=0.8)
    torch.testing.assert_close(z, logits / 0.8)
    assert not ks.NO_TRUNCATION.active
    assert ks.NO_TRUNCATION.k_bound(V) == V


def test_top_k_keeps_ties_at_the_kth_value():
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0, 0.0]])
    z = truncated_logits(logits, Truncation(top_k=2), temperature=1.0)
    assert kept_of(z)[0].tolist() == [0, 1, 2, 3]


def test_max_kept_cuts_a_tie_group_at_its_lowest_ids():
    logits = torch.tensor([[1.0, 5.0, 1.0, 1.0, 1.0, 0.0]])
    z = truncated_logits(logits, Truncation(top_k=2, max_kept=3), temperature=1.0)
    assert kept_of(z)[0].tolist() == [0, 1, 2]
    z = truncated_logits(logits, Truncation(top_p=0.999, max_kept=3), temperature=1.0)
    assert kept_of(z)[0].tolist() == [0, 1, 2]  # top-p alone still applies top_k <= max_kept


def test_top_p_keeps_or_drops_a_tie_group_whole_and_keeps_the_crossing_token():
    # p = [1/2, 1/4, 1/8, 1/8]: exact in float32 (powers of two)
    logits = torch.log(torch.tensor([[4.0, 2.0, 1.0, 1.0]]))
    cases = {0.3: [0], 0.5: [0], 0.51: [0, 1], 0.75: [0, 1], 0.76: [0, 1, 2, 3], 1.0: [0, 1, 2, 3]}
    for top_p, want in cases.items():
        z = truncated_logits(logits, Truncation(top_p=top_p), temperature=1.0)
        assert kept_of(z)[0].tolist() == want, top_p


def test_min_p_drops_tokens_less_probable_than_min_p_times_the_top_one():
    logits = torch.log(torch.tensor([[0.5, 0.26, 0.24, 0.0001]]))
    z = truncated_logits(logits, Truncation(min_p=0.5), temperature=1.0)
    assert kept_of(z)[0].tolist() == [0, 1]


def test_top_p_works_on_what_min_p_and_top_k_left():
    # min_p 0.3 drops token 3 (0.05 < 0.3 * 0.4); top-k 2 keeps 0, 1; within those the mass above
    # token 1 is 0.4 / 0.75 = 0.53 (over the whole vocabulary it would be 0.4)
    logits = torch.log(torch.tensor([[0.4, 0.35, 0.2, 0.05]]))
    for top_p, want in ((0.5, [0]), (0.55, [0, 1])):
        trunc = Truncation(top_k=2, top_p=top_p, min_p=0.3)
        assert kept_of(truncated_logits(logits, trunc, temperature=1.0))[0].tolist() == want


def test_the_learners_renormalised_log_prob_is_log_q_and_the_full_vocabulary_one_is_not():
    logits = torch.from_numpy(logit_rows(3)).double()
    trunc = Truncation(top_p=0.7)
    z = truncated_logits(logits, trunc, temperature=0.9)
    tokens = z.argmax(-1)
    log_q = torch.log_softmax(z, -1).gather(-1, tokens[:, None])[:, 0]
    kept = [np.flatnonzero(torch.isfinite(row).numpy()) for row in z]
    width = max(len(k) for k in kept)
    kept_NK = torch.zeros(len(kept), width, dtype=torch.long)
    valid_NK = torch.zeros(len(kept), width, dtype=torch.bool)
    for n, k in enumerate(kept):
        others = [int(i) for i in k if i != tokens[n]]
        kept_NK[n, : len(k)] = torch.tensor([int(tokens[n]), *others])
        valid_NK[n, : len(k)] = True
    got = kept_set_logprobs(logits, kept_NK, valid_NK, temperature=0.9)
    torch.testing.assert_close(got, log_q, rtol=0, atol=1e-12)
    full = sampled_logprobs(logits, tokens, temperature=0.9)
    log_p = torch.log_softmax(logits / 0.9, -1)
    mass = torch.logsumexp(log_p.masked_fill(~torch.isfinite(z), -math.inf), -1)
    torch.testing.assert_close(full - got, mass, rtol=0, atol=1e-12)  # log S, the bias removed
    assert (mass < -1e-3).any()  # S < 1 somewhere: the naive ratio is not 1


# ---------------------------------------------------------------------------------------------
# The encoding


def test_sets_encode_as_offsets_and_the_other_ids_and_concatenate_per_group():
    a = ks.from_lists([np.array([1, 5]), np.array([], np.int32), np.array([0])], unknown=[1])
    b = ks.from_lists([np.array([2, 3, 4])])
    assert a.offsets.tolist() == [0, 2, 2, 3]
    assert a.ids.tolist() == [1, 5, 0]
    assert a.sizes().tolist() == [3, 0, 2]
    assert a.trained(3).tolist() == [True, False, True]
    both = ks.concat([a, b], [3, 1])
    assert both.offsets.tolist() == [0, 2, 2, 3, 6]
    assert both.ids.tolist() == [1, 5, 0, 2, 3, 4]
    assert both.unknown.tolist() == [1]
    back = both.slice(3, 4)
    assert back.offsets.tolist() == [0, 3]
    assert (back.ids.tolist(), back.unknown.tolist()) == ([2, 3, 4], [])
    assert both.slice(0, 3).unknown.tolist() == [1]
    assert not ks.concat([KeptSets(), KeptSets()], [2, 3]).present


TOKENS = np.array([3, 7, 2], np.int32)


def sets(offsets: list[int], ids: list[int], unknown: list[int] | None = None) -> KeptSets:
    i32 = np.int32
    return KeptSets(np.array(offsets, i32), np.array(ids, i32), np.array(unknown or [], i32))


@pytest.mark.parametrize(
    ("kept", "fragment"),
    [
        (sets([0, 1, 1], [4]), "one count per token"),
        (sets([1, 1, 1, 1], [4]), "one count per token"),
        (sets([0, 2, 1, 2], [4, 5]), "not decrease"),
        (sets([0, 1, 1, 1], [99]), "out of range"),
        (sets([0, 1, 1, 1], [-1]), "out of range"),
        (sets([0, 2, 2, 2], [5, 4]), "ascending"),
        (sets([0, 2, 2, 2], [4, 4]), "ascending"),
        (sets([0, 1, 2, 2], [4, 7]), "sampled token"),
        (sets([0, 4, 4, 4], [4, 5, 6, 8]), "max_kept"),
        (sets([0, 0, 0, 0], [], [3]), "unknown"),
        (sets([0, 0, 0, 0], [], [1, 1]), "unknown"),
        (sets([0, 1, 1, 1], [4], [0]), "lists kept ids"),
        (sets([], [4]), "without offsets"),
    ],
)
def test_a_malformed_encoding_is_named(kept, fragment):
    problem = ks.encoding_problem(kept, TOKENS, vocab_size=16, max_kept=4)
    assert problem is not None
    assert fragment in problem


def test_a_well_formed_encoding_has_no_problem_and_sets_may_restart_low():
    kept = sets([0, 3, 3, 5], [0, 4, 9, 0, 1])
    assert ks.encoding_problem(kept, TOKENS, vocab_size=16, max_kept=4) is None
    assert ks.encoding_problem(KeptSets(), TOKENS, vocab_size=16, max_kept=4) is None


@pytest.mark.parametrize(
    "kept",
    [sets([0, 3, 3, 5], [0, 4, 9, 0, 1]), sets([0, 0, 0, 0], [], [0, 2]), sets([], [])],
    ids=["sets", "all_unknown", "untruncated"],
)
def test_the_wire_form_of_the_offsets_rebuilds_them(kept):
    counts = kept.other_counts()
    assert counts.dtype == np.uint8
    assert len(counts) == max(len(kept.offsets) - 1, 0)
    back = ks.from_counts(counts, kept.ids, kept.unknown)
    assert back.present == kept.present
    assert back.offsets.tolist() == kept.offsets.tolist()


def test_counts_that_do_not_sum_to_the_ids_are_refused_without_overflow():
    """Counts of 255 on 2**24 tokens sum past int32: refused, not wrapped around to a match."""
    counts = np.full(1 << 24, 255, np.uint8)
    kept = ks.from_counts(counts, np.zeros(7, np.int32), np.zeros(0, np.int32))
    problem = ks.encoding_problem(kept, np.zeros(1 << 24, np.int32), vocab_size=16, max_kept=256)
    assert problem is not None
    assert "one count per token" in problem
