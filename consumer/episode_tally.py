"""What the episodes of one step say (multi-turn runs): the tally of every group of episodes that
arrived for it, kept or dropped, beside the rewards' (consumer/reward_tally.py owns one).

Its `fields()` are the step's episode metrics (common/files/metrics.py `StepRecord`), all None
in a run of single completions (no group carried `sampled_bits`):
- `episode_turns_mean`: model turns per episode;
- `episode_tokens_mean`: tokens per episode after its prompt, sampled and inserted;
- `episode_sampled_frac`: the share of those tokens the model sampled (the rest the
  environment inserted: never trained);
- `env_s_mean`: seconds per episode inside its environment (simulated latency included);
- `env_errors`: episodes an environment failed (`env_error`: never trained);
- `episode_ends`: {how an episode ended (wire FINISH_REASONS): episodes}.
Turns are counted from the bits: a model turn is a run of sampled tokens.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common import wire


@dataclass
class EpisodeTally:
    episodes: int = 0
    turns: int = 0
    tokens: int = 0
    sampled: int = 0
    env_s: float = 0.0
    ends: Counter[str] = field(default_factory=Counter)

    def add(self, g: wire.Group) -> None:
        """Count one arrived group (nothing for a group of single completions)."""
        if not g.episodes:
            return
        mask = g.sampled_mask()
        self.episodes += g.group_size
        self.turns += turns_of(mask, g.completion_lens)
        self.tokens += g.num_tokens
        self.sampled += g.num_sampled
        self.env_s += g.env_s
        self.ends.update(g.finish_reasons)

    def fields(self) -> dict[str, Any]:
        """The step's episode fields (module docstring); None each without episodes."""
        if not self.episodes:
            return dict.fromkeys(
                (
                    "episode_turns_mean",
                    "episode_tokens_mean",
                    "episode_sampled_frac",
                    "env_s_mean",
                    "env_errors",
                    "episode_ends",
                )
            )
        n = self.episodes
        return {
            "episode_turns_mean": self.turns / n,
            "episode_tokens_mean": self.tokens / n,
            "episode_sampled_frac": self.sampled / max(self.tokens, 1),
            "env_s_mean": self.env_s / n,
            "env_errors": self.ends.get("env_error", 0),
            "episode_ends": dict(self.ends),
        }


def turns_of(mask: np.ndarray, lens: np.ndarray) -> int:
    """Model turns in completions of lengths `lens` whose tokens `mask` marks as sampled: each
    run of sampled tokens within a completion is one."""
    starts = np.zeros(len(mask), bool)
    starts[1:] = mask[1:] & ~mask[:-1]
    first = np.cumsum(lens) - lens  # a completion's first token starts a run (it is sampled)
    starts[first[lens > 0]] = mask[first[lens > 0]]
    return int(starts.sum())
