"""common/task/pass_at_k.py: the unbiased estimator against brute force over every k-subset."""

from __future__ import annotations

import itertools
import math

import pytest

from common.task.pass_at_k import mean_pass_at_k, pass_at_k


def brute_force(n: int, c: int, k: int) -> float:
    """The share of the k-subsets of n completions (c of them passing) holding a passing one."""
    passing = [i < c for i in range(n)]
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(passing[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_the_share_of_k_subsets_with_a_pass(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12)


def test_pass_at_k_is_the_closed_form_for_a_large_n():
    n, c, k = 200, 13, 10
    expected = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12)


def test_pass_at_1_is_the_pass_rate_and_pass_at_n_is_any_pass():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(8, 0, 8) == 0.0


def test_the_mean_is_over_prompts():
    assert mean_pass_at_k([(4, 4), (4, 0)], 1) == pytest.approx(0.5)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_impossible_counts_are_refused(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)
