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
Turns are counted from the bits (`wire.Group.turns`): a model turn is a run of sampled tokens.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from common import wire

FIELDS = (  # the step's episode metrics, in the order of the module docstring
    "episode_turns_mean",
    "episode_tokens_mean",
    "episode_sampled_frac",
    "env_s_mean",
    "env_errors",
    "episode_ends",
)


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
        self.episodes += g.group_size
        self.turns += int(g.turns().sum())
        self.tokens += g.num_tokens
        self.sampled += g.num_sampled
        self.env_s += g.env_s
        self.ends.update(g.finish_reasons)

    def fields(self) -> dict[str, Any]:
        """The step's episode fields (module docstring); None each without episodes."""
        if not self.episodes:
            return dict.fromkeys(FIELDS)
        n = self.episodes
        return {
            "episode_turns_mean": self.turns / n,
            "episode_tokens_mean": self.tokens / n,
            "episode_sampled_frac": self.sampled / max(self.tokens, 1),
            "env_s_mean": self.env_s / n,
            "env_errors": self.ends.get("env_error", 0),
            "episode_ends": dict(self.ends),
        }
