"""pass@k: the chance that at least one of k completions of a prompt passes, estimated without
bias from n >= k completions of which c passed (Chen et al. 2021, "Evaluating Large Language
Models Trained on Code", eq. 1):

    pass@k = 1 - C(n - c, k) / C(n, k)

(the chance that k completions drawn without replacement from the n all fail, subtracted from 1),
computed as the product 1 - prod_{i = n-c+1}^{n} (1 - k / i) so that large n never overflows.
pass@1 is then c / n. A benchmark's pass@k is the mean over its prompts.
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate of one prompt with `c` passing completions out of `n`."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:  # every draw of k holds a passing completion
        return 1.0
    fail = 1.0
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """The mean pass@k over prompts, each given as (n completions, c passing)."""
    if not counts:
        raise ValueError("pass@k of no prompts")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
