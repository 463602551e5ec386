"""The learner's own held-out evaluation, on the training thread: greedy accuracy on the
synthetic task's held-out split every `eval.learner_every_steps` steps (consumer/learner.py).

`LearnerEval(cfg, model_dir, every_steps=N)`: `due(version)` says whether a version is evaluated
(a real model on the synthetic task, every N versions; N = 0: never); calling it with a version
and a way to get the model returns the step's fields (`accuracy_fields`: `heldout_accuracy`,
`eval_s`), `{}` when the version is not due. The training thread waits while it decodes; the
tokenizer and the held-out problems (`eval.learner_prompts` of them, seeded by `run.seed`) are
loaded at the first evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.config import Config
from common.task.synthetic import Example, make_examples
from consumer.evaluation.greedy import accuracy_fields, accuracy_of


class LearnerEval:
    """Held-out greedy accuracy every `every_steps` versions (synthetic task, real model)."""

    def __init__(self, cfg: Config, model_dir: Path | None, *, every_steps: int) -> None:
        self.cfg, self.model_dir = cfg, model_dir
        self.every_steps = every_steps if model_dir is not None else 0
        if cfg.task.source != "synthetic":
            self.every_steps = 0
        self._loaded: tuple[Any, list[Example]] | None = None

    @property
    def enabled(self) -> bool:
        """True when some version is evaluated."""
        return self.every_steps > 0

    def due(self, version: int) -> bool:
        """True when `version` is evaluated."""
        return self.enabled and version % self.every_steps == 0

    def __call__(self, version: int, model: Callable[[], Any]) -> dict[str, float]:
        """`model()` gives the model to decode with (called only when this version is due)."""
        if not self.due(version):
            return {}
        t0 = time.perf_counter()
        if self._loaded is None:
            from transformers import AutoTokenizer

            n, seed = self.cfg.eval.learner_prompts, self.cfg.run.seed
            examples = make_examples("heldout", n, seed=seed)
            self._loaded = (AutoTokenizer.from_pretrained(self.model_dir), examples)
        tokenizer, examples = self._loaded
        result = accuracy_of(
            model(), tokenizer, examples, max_new_tokens=self.cfg.sampling.max_new_tokens
        )
        return accuracy_fields(result, time.perf_counter() - t0)
