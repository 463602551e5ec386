"""Multi-turn episodes in the producer: an environment answers the model between its turns.

The rooms (each runs on the producer's event loop unless said):
- contract.py: what an environment is given and may return (`Reply`, `End`, `@environment`);
  what user code imports;
- calls.py: an environment resolved and called once, under its timer (in an environment worker
  process, or inline for the built-ins);
- runner.py: where each call runs (inline or a killable worker pool), its simulated latency,
  the counters and the log lines of failures;
- render.py: the token ids of the opening and of each environment turn, as a delta (never
  re-tokenizing what was sampled);
- tools.py: tools an environment dispatches, described to the model and called;
- loop.py: the episode loop itself (G episodes of one lease);
- guess.py: the built-in multi-turn task (`episodes.env = "guess"`);
- heldout.py: held-out episodes played and scored as in training (lent to the consumer's
  evaluation by the judge; runs in the evaluating process).

`open_episodes(spec, codec, workers=...)` builds the `Episodes` of a session (None for a run of
single completions); `Episodes.close()` stops its worker processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common import wire
from producer.episodes.contract import End, Reply, environment

if TYPE_CHECKING:
    from producer.episodes.render import TurnRenderer
    from producer.episodes.runner import EnvRunner
    from producer.tokenizer import PromptCodec

__all__ = ["End", "Episodes", "Reply", "environment", "open_episodes"]


@dataclass(frozen=True, slots=True, eq=False)
class Episodes:
    """What a session samples episodes with: the run's episode settings, the renderer of turns
    and the environment's runner."""

    spec: wire.EpisodeSpec
    renderer: TurnRenderer
    runner: EnvRunner

    @property
    def counters(self) -> dict[str, float]:
        return self.runner.counters

    def close(self) -> None:
        self.runner.close()


def open_episodes(
    spec: wire.EpisodeSpec | None, codec: PromptCodec, *, workers: int
) -> Episodes | None:
    """The episodes of a run whose spec has them (None otherwise); `ConfigError` for an
    environment that cannot be found or a chat template that cannot be extended turn by turn."""
    if spec is None:
        return None
    from producer.episodes.render import TurnRenderer
    from producer.episodes.runner import EnvRunner

    runner = EnvRunner(spec, workers=workers)
    try:
        renderer = TurnRenderer(codec, tools=runner.tools)
    except BaseException:
        runner.close()
        raise
    return Episodes(spec, renderer, runner)
