"""A batch's advantages from its groups: their rewards, each completion's sampled tokens (an
episode's inserted tokens are not the model's length), those with an unknown kept set, and the
episodes their environment failed, handed to the pure rules of consumer/train/advantages.py.

Runs in the training thread (consumer/train/trainer.py `DeviceTrainer.step`).
"""

from __future__ import annotations

import numpy as np
import torch

from common.wire import Group
from consumer.train import advantages as ADV
from consumer.train.batching import trained_NG


def batch_advantages(groups: list[Group], options: ADV.AdvantageOptions) -> np.ndarray:
    """float64 [N, G] advantages of the groups' completions (`advantages.advantages_of`): the
    completions' sampled tokens for the overlong punishment (an episode's inserted tokens are
    not the model's length), those less the ones with an unknown kept set for the whitened
    baselines; episodes their environment failed do not count (`trained_NG`)."""
    rewards_NG = torch.from_numpy(np.stack([np.asarray(g.rewards, np.float64) for g in groups]))
    lengths_NG = tokens_NG = None
    if options.overlong_window or options.needs_tokens:
        lengths = np.stack([sampled_per_completion(g) for g in groups])
        lengths_NG = torch.from_numpy(lengths)
        if options.needs_tokens:
            unknown = np.stack(
                [
                    _unknown_per_completion(g, ends)
                    for g, ends in zip(groups, np.cumsum(lengths, axis=1), strict=True)
                ]
            )
            tokens_NG = torch.from_numpy(lengths - unknown)
    valid_NG = torch.from_numpy(trained_NG(groups))  # episodes an environment failed: out
    adv_NG = ADV.advantages_of(
        rewards_NG, options, lengths_NG=lengths_NG, tokens_NG=tokens_NG, valid_NG=valid_NG
    )
    return adv_NG.numpy()


def sampled_per_completion(g: Group) -> np.ndarray:
    """int64 [G]: the tokens of each completion the model sampled (all of a plain one)."""
    lens = np.asarray(g.completion_lens, np.int64)
    if not g.episodes:
        return lens
    owner = np.repeat(np.arange(len(lens)), lens)
    return np.bincount(owner, weights=g.sampled_mask(), minlength=len(lens)).astype(np.int64)


def _unknown_per_completion(g: Group, sampled_ends: np.ndarray) -> np.ndarray:
    """int64 [G]: each completion's tokens with an unknown kept set (`kept_unknown` indexes the
    sampled tokens)."""
    at = np.searchsorted(sampled_ends, g.kept_unknown, side="right")
    return np.bincount(at, minlength=len(sampled_ends))
