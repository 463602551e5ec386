"""A replay's held-out evaluation in a process of its own, beside training (consumer/replay.py).

The learner's own evaluation (consumer/evaluation/periodic.py) stops the training thread while
it decodes the held-out problems. A replay has no producers, so the core they used is free:
`EvalProcess` does the same evaluation there, at the same cadence (`due`: every
`eval.learner_every_steps` versions). `submit(version, state)` copies the weights into shared
memory (the only cost to the training thread) and returns; a spawned child (`asyncgrpo-eval`, one
torch thread) loads them into its own float32 copy of the model (the learner's dtype on a CPU)
and decodes greedily with `accuracy_of` (consumer/evaluation/greedy.py), the rule every greedy
evaluation shares, so the accuracy is the one the training thread would have measured.
`results()` hands back what has finished; `drain()` waits for the rest.

Failures are never silent: an exception in the child comes back as an `EvalError` naming the
version and the error, and a child that dies (killed, out of memory) is reported by exit code at
the next `results()`/`drain()`.
"""

from __future__ import annotations

import logging
import queue
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from common.errors import EvalError

log = logging.getLogger("asyncgrpo.consumer")
_POLL_S = 1.0  # how often a waiting drain() checks that the child is alive


@dataclass(frozen=True, slots=True)
class EvalSpec:
    """What the child evaluates (the model directory and the held-out problems: `num_prompts`
    of them, seeded by `seed`) and how often (`every_steps` versions)."""

    model_dir: str
    num_prompts: int
    seed: int
    max_new_tokens: int
    every_steps: int


class EvalProcess:
    def __init__(self, spec: EvalSpec) -> None:
        ctx = torch.multiprocessing.get_context("spawn")
        self._jobs: Any = ctx.Queue()
        self._done: Any = ctx.Queue()
        self._proc = ctx.Process(
            target=serve, args=(spec, self._jobs, self._done), name="asyncgrpo-eval", daemon=True
        )
        self._proc.start()
        self.every_steps = spec.every_steps
        self._waiting: set[int] = set()

    def due(self, version: int) -> bool:
        """True when `version` is evaluated."""
        return version % self.every_steps == 0

    def submit(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Evaluate `state` (HF names, on any device) as `version`; returns once it is copied."""
        shared = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        for tensor in shared.values():
            tensor.share_memory_()  # type: ignore[no-untyped-call]
        self._waiting.add(version)
        self._jobs.put((version, shared))

    @property
    def waiting(self) -> frozenset[int]:
        """Versions submitted and not yet evaluated."""
        return frozenset(self._waiting)

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._proc.pid

    def results(self) -> dict[int, dict[str, float]]:
        """Finished evaluations by version: `{"heldout_accuracy", "eval_s"}` (no waiting)."""
        out: dict[int, dict[str, float]] = {}
        while True:
            try:
                self._take(self._done.get_nowait(), out)
            except queue.Empty:
                break
        if self._waiting and not self._proc.is_alive():
            self._died()
        return out

    def drain(self) -> dict[int, dict[str, float]]:
        """Wait for every submitted evaluation (the child's errors re-raised)."""
        out = self.results()
        while self._waiting:
            try:
                self._take(self._done.get(timeout=_POLL_S), out)
            except queue.Empty:
                if not self._proc.is_alive():
                    self._died()
        return out

    def close(self) -> None:
        """Stop the child (it finishes the evaluation it is in)."""
        if self._proc.is_alive():
            self._jobs.put(None)
            self._proc.join(timeout=60)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._jobs.close()
        self._done.close()

    def _take(self, item: tuple[int, dict[str, float] | str], out: dict[int, Any]) -> None:
        version, result = item
        self._waiting.discard(version)
        if isinstance(result, str):
            raise EvalError(f"held-out evaluation of version {version} failed: {result}")
        out[version] = result

    def _died(self) -> None:
        first = min(self._waiting)
        raise EvalError(
            f"the held-out evaluation process exited (code {self._proc.exitcode}) before "
            f"version {first} was evaluated"
        )


def serve(spec: EvalSpec, jobs: Any, done: Any) -> None:
    """The child: evaluate each `(version, state)` from `jobs` until None."""
    torch.set_num_threads(1)
    from common.task.synthetic import make_examples
    from consumer.evaluation.greedy import accuracy_fields, accuracy_of, load_model

    model, tokenizer = load_model(Path(spec.model_dir))
    examples = make_examples("heldout", spec.num_prompts, seed=spec.seed)
    while (job := jobs.get()) is not None:
        version, state = job
        t0 = time.perf_counter()
        try:
            model.load_state_dict(state, strict=True)
            result = accuracy_of(model, tokenizer, examples, max_new_tokens=spec.max_new_tokens)
        except Exception as exc:  # reported to the parent, which stops the replay with it
            log.debug("evaluation of version %d failed:\n%s", version, traceback.format_exc())
            done.put((version, f"{type(exc).__name__}: {exc}"))
            continue
        done.put((version, accuracy_fields(result, time.perf_counter() - t0)))
