"""The prompts' common prefix, prefilled once per weights version and shared by every lease.

A task's prompts usually begin alike: a chat template's system turn and the question's fixed
wording (docs/real_model's 44-token prompts share their first 29: the system message and "What
is the capital of"). The hf engine prefills each prompt once for its G rows already
(producer/engines/hf_batch.py); this keeps the KV cache of the longest prefix the prompts have
in common, so that admitting k prompts prefills only their k suffixes: on that task 15 of 44
positions each, and two thirds of a group's prefill are gone.

`PrefixCache` learns the prefix from the prompts it is shown (`observe`): the longest common
prefix of the prompts admitted together, shortened by later ones that differ earlier, used once
it is at least `MIN_TOKENS` long and a prompt has more than it (every row needs a suffix
position to sample from). Its KV cache is computed on first use after each weights load
(`invalidate` at every reload: the cache is a function of the weights) by one forward of the
prefix alone, and handed to each admission as a copy repeated for its k prompts. The suffixes
then sit right after the prefix, left-padded to the longest among them (the padding masked in
the middle of the row), with position ids continuing the prefix's: every real token has the
position and the keys it would have had in a prefill of the whole prompt, so the log-probs are
those of the full prefill up to float rounding (a forward of another shape rounds differently).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

MIN_TOKENS = 8  # a shorter prefix is not worth a forward of its own


def common_prefix(prompts: Sequence[Sequence[int]]) -> list[int]:
    """The longest prefix every one of `prompts` starts with."""
    if not prompts:
        return []
    first = prompts[0]
    n = min(len(p) for p in prompts)
    for i in range(n):
        if any(p[i] != first[i] for p in prompts[1:]):
            return list(first[:i])
    return list(first[:n])


class PrefixCache:
    """The learned common prefix and its KV cache at the current weights (see module doc)."""

    def __init__(self, min_tokens: int = MIN_TOKENS) -> None:
        self.min_tokens = min_tokens
        self.ids: list[int] = []  # the prefix (empty: none learned yet)
        self._cache: Any = None  # its KV cache, batch 1, at the current weights
        self.num_computed = 0  # prefix forwards run (one per weights version it was used at)

    def observe(self, prompts: Sequence[Sequence[int]]) -> None:
        """Learn from prompts admitted together: the prefix they and the current one share."""
        seen = [*prompts, self.ids] if self.ids else list(prompts)
        if len(seen) < 2:
            return
        ids = common_prefix(seen)
        if ids != self.ids:
            self.ids, self._cache = ids, None

    def fits(self, prompt: Sequence[int]) -> bool:
        """Whether `prompt` is prefilled after the cached prefix."""
        n = len(self.ids)
        return n >= self.min_tokens and len(prompt) > n and list(prompt[:n]) == self.ids

    def invalidate(self) -> None:
        """The weights changed: the KV cache is recomputed at its next use."""
        self._cache = None

    @torch.inference_mode()
    def repeated(self, prefill: Callable[[torch.Tensor], Any], rows: int) -> Any:
        """A copy of the prefix's KV cache for `rows` prompts; `prefill(ids [1, P])` returns the
        cache of a forward of the prefix alone (run once per weights version)."""
        if self._cache is None:
            self._cache = prefill(torch.tensor([self.ids], dtype=torch.long))
            self.num_computed += 1
        cache = copy.deepcopy(self._cache)
        device = cache.layers[0].keys.device
        cache.batch_select_indices(torch.zeros(rows, dtype=torch.long, device=device))
        return cache
