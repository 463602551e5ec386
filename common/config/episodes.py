"""`[episodes]`: multi-turn episodes, an environment answering the model between its turns.

Empty `env` (the default): one completion per sample, as always. Set, every sample of a group is
an episode (producer/episodes/, docs/episodes.md): the model's turn, the environment's answer,
the model's next turn, until the environment ends it or `max_turns` / `max_episode_tokens`
stops it. The consumer sends these keys to its producers (`wire.EpisodeSpec`) except
`workers`, each producer's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.config.fields import _f, failed

if TYPE_CHECKING:
    from common import wire


@dataclass(frozen=True, slots=True)
class EpisodesConfig:
    """`[episodes]`: the environment of multi-turn episodes (the module docstring)."""

    env: str = _f(
        "",
        "The environment of multi-turn episodes: a built-in ('guess': the demo's multi-turn "
        "task, an answer then 'too high' or 'too low' and another try) or 'module:function' "
        "(docs/episodes.md); empty = one completion per sample, no environment.",
    )
    max_turns: int = _f(3, "Model turns per episode at most (the environment sees each).")
    max_episode_tokens: int = _f(
        512,
        "Tokens of an episode after its prompt at most, sampled and inserted; a model turn "
        "samples at most what is left (and sampling.max_new_tokens); an environment's messages "
        "that do not fit end the episode (max_tokens, counted, logged) and the reward "
        "functions score it.",
    )
    timeout_s: float = _f(
        10.0,
        "Seconds one environment call may take (simulated latency aside); a slower call ends "
        "its episode (env_error) and is counted.",
    )
    workers: int = _f(
        2,
        "Environment worker processes per producer for a 'module:function' environment (a "
        "hung or crashing call costs a worker, not the producer); built-ins run in the "
        "producer.",
    )
    latency_s: float = _f(
        0.0,
        "Simulated environment latency (stress tests): each environment call first waits a "
        "Pareto draw of this scale, seeded per episode and turn (0 = none).",
    )
    latency_alpha: float = _f(
        1.5,
        "Tail index of the simulated latency's Pareto draw (> 1; smaller = heavier tail; mean "
        "latency_s * alpha / (alpha - 1)).",
    )

    @property
    def on(self) -> bool:
        """Whether samples are episodes."""
        return bool(self.env)

    def spec(self) -> wire.EpisodeSpec | None:
        """The episodes as the consumer tells its producers (None: single completions)."""
        from common import wire

        if not self.on:
            return None
        return wire.EpisodeSpec(
            env=self.env,
            max_turns=self.max_turns,
            max_episode_tokens=self.max_episode_tokens,
            timeout_s=self.timeout_s,
            latency_s=self.latency_s,
            latency_alpha=self.latency_alpha,
        )

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        return failed(
            (self.max_turns >= 1, "episodes.max_turns must be >= 1"),
            (self.max_episode_tokens >= 1, "episodes.max_episode_tokens must be >= 1"),
            (
                math.isfinite(self.timeout_s) and self.timeout_s > 0,
                "episodes.timeout_s must be > 0",
            ),
            (self.workers >= 1, "episodes.workers must be >= 1"),
            (
                math.isfinite(self.latency_s) and self.latency_s >= 0,
                "episodes.latency_s must be >= 0",
            ),
            (
                math.isfinite(self.latency_alpha) and self.latency_alpha > 1,
                "episodes.latency_alpha must be > 1 (a finite mean latency)",
            ),
        )
