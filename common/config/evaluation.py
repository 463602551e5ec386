"""`[eval]`: every way of evaluating a model, one section (consumer/evaluation/ runs them).

- The held-out rows (`path`, `split`): every way reads them (the synthetic task has its own
  held-out split).
- `asyncgrpo launch`'s scores of the starting and the final model, a sweep's snapshots and
  `asyncgrpo eval` (`mode`): the whole held-out split, scored with the run's rewards.
- The learner's own evaluation (`learner_every_steps`, `learner_prompts`): greedy accuracy on
  the synthetic task, on the training thread (which waits for it).
- Evaluation during training through the producers (`every_steps` and the keys after it): every
  `eval.every_steps` policy versions the consumer leases the held-out prompts to producers that
  hold exactly that version, ahead of training leases; the groups they send back are scored with
  the run's rewards, never trained, and reported per version (`eval_*` in metrics.jsonl). The
  learner never waits for it, and with it on the learner's own evaluation is off (said once at
  start).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.config.fields import EvalMode, _f, failed

MAX_EVAL_SAMPLES = 256  # k per prompt: one group message holds them all
MAX_EVAL_SLOTS = 1 << 10  # eval leases one producer holds at once: one grant's (wire.sizes)


def eval_slots(max_in_flight: int, group_size: int, samples_per_prompt: int) -> int:
    """Eval leases a producer holding a round's version may have in flight beside its
    `max_in_flight` training slots: as many completions as those slots hold (an eval group of k
    completions takes k/G of a slot), at least `max_in_flight` groups, at most `MAX_EVAL_SLOTS`.
    So a round of greedy prompts (k = 1) is sampled in one batch of G x max_in_flight rows, not
    in G waves, and the producer's version is held for it that much less long."""
    per_slot = max(1, group_size // max(1, samples_per_prompt))
    return min(max_in_flight * per_slot, MAX_EVAL_SLOTS)


@dataclass(frozen=True, slots=True)
class EvalConfig:
    """`[eval]`: every way of evaluating a model (the module docstring)."""

    path: str = _f(
        "",
        "Held-out rows, read like task.path (with task.source = synthetic: Parquet if it ends in "
        ".parquet, else JSONL), scored with rewards.fns; empty = the synthetic task's held-out "
        "split (another task then has no held-out score).",
    )
    split: str = _f("test", "task.source = hf: the split of eval.path to evaluate on.")
    mode: EvalMode = _f(
        "greedy",
        "How eval.path's completions are sampled for the start and final scores (launch), a "
        "sweep's snapshots and `asyncgrpo eval`: greedy, or one sample per prompt at "
        "sampling.temperature.",
    )
    learner_every_steps: int = _f(
        0,
        "Steps between the learner's own greedy evaluations on the synthetic held-out split "
        "(0 = off; the training thread waits for each). Off while eval.every_steps is on.",
    )
    learner_prompts: int = _f(200, "Held-out problems per learner evaluation.")
    every_steps: int = _f(
        0,
        "Policy versions between evaluations through the producers (0 = off; the learner never "
        "waits). Version 0, the starting model, is evaluated first.",
    )
    samples_per_prompt: int = _f(
        1, "Completions per held-out prompt (k of pass@k; pass@1 is estimated from all k)."
    )
    temperature: float = _f(
        1.0,
        "Sampling temperature of evaluation completions (0 = greedy; then samples_per_prompt "
        "must be 1). top_p, top_k and min_p are the run's.",
    )
    max_prompts: int = _f(
        64,
        "Held-out prompts per evaluation through the producers (the first ones of eval.path, "
        "in file order).",
    )
    pass_reward: float = _f(
        1.0, "A completion passes (pass@k) when its reward (the weighted sum) is >= this."
    )
    final_wait_s: float = _f(
        120.0,
        "At the end of a run of run.steps, how long the learner waits for the round of its last "
        "version (begun whether or not a multiple of every_steps) before its last metrics line "
        "(0 = no wait: that round is not reported).",
    )

    @property
    def on(self) -> bool:
        """Evaluation during training through the producers."""
        return self.every_steps > 0

    @property
    def in_learner(self) -> bool:
        """The learner's own evaluation: asked for, and not superseded by the producers'."""
        return self.learner_every_steps > 0 and not self.on

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        return failed(
            (self.every_steps >= 0, "eval.every_steps must be >= 0 (0 = off)"),
            (self.final_wait_s >= 0, "eval.final_wait_s must be >= 0 (0 = no wait)"),
            (self.learner_every_steps >= 0, "eval.learner_every_steps must be >= 0 (0 = off)"),
            (self.learner_prompts >= 1, "eval.learner_prompts must be >= 1"),
            (
                1 <= self.samples_per_prompt <= MAX_EVAL_SAMPLES,
                f"eval.samples_per_prompt must be in [1, {MAX_EVAL_SAMPLES}]",
            ),
            (
                math.isfinite(self.temperature) and self.temperature >= 0,
                "eval.temperature must be finite and >= 0 (0 = greedy)",
            ),
            (
                self.temperature > 0 or self.samples_per_prompt == 1,
                "eval.temperature = 0 (greedy) gives k equal completions: set "
                "eval.samples_per_prompt = 1, or a temperature > 0",
            ),
            (self.max_prompts >= 1, "eval.max_prompts must be >= 1"),
            (math.isfinite(self.pass_reward), "eval.pass_reward must be finite"),
        )
