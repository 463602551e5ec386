"""Greedy held-out accuracy of a model directory or snapshot on the synthetic task.

Owns the evaluation rule the launcher, `asyncgrpo eval` and the learner's periodic evaluation share:
greedy decoding (no sampling) of the prompts of `common.task.synthetic`' held-out split, batched
with left padding, each completion ending at EOS or after `max_new_tokens`, judged by
`common.task.synthetic.is_correct` on the decoded text (special tokens removed). Does not train or
sample; never touches the train split.

- `greedy_accuracy(model_dir, snapshot=...)` loads `model_dir` (config, tokenizer, weights) in
  float32 and, if given, a snapshot `model.safetensors` over the weights: every tensor is cast to
  the model's dtype, after `common.weights.snapshot.check_fits` (the engines' rule: names and shapes
  agree, tied embeddings may be stored once) or a `SnapshotError`.
- `accuracy_of(model, tokenizer, examples)` decodes with a model already in memory and leaves
  its train/eval mode and the tokenizer's padding side as they were.
- `PeriodicEval`: the learner's (and a replay's) held-out accuracy every `train.eval_every`
  steps on the synthetic task with a real model: `{"heldout_accuracy", "eval_s"}` or `{}`;
  the learner's is superseded (never run) when `eval.every_steps` is set: the producers
  evaluate then, and the learner never waits for an evaluation (consumer/server/eval_book.py);
  a replay, which has no producers, still evaluates (`due`).
- `evaluate_run(run_dir, model_dir)` evaluates the snapshot a finished run ended with (and, with
  `initial=True`, the model it started from) on the whole held-out split and writes
  `RUN_DIR/eval.json`: `final_accuracy`, `heldout_size`, `final_version`, `model` (and
  `initial_accuracy`). The launcher and the stress sweep both use it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.files import run_files as RF
from common.task.synthetic import Example, is_correct, make_examples
from common.weights import snapshot as snap

log = logging.getLogger("asyncgrpo.consumer")


@dataclass(frozen=True, slots=True)
class EvalResult:
    accuracy: float
    correct: int
    total: int


class PeriodicEval:
    """Held-out greedy accuracy every train.eval_every steps (synthetic task, real model)."""

    def __init__(self, cfg: Any, model_dir: Path | None) -> None:
        self.cfg, self.model_dir = cfg, model_dir
        self._loaded: tuple[Any, list[Example]] | None = None

    @property
    def enabled(self) -> bool:
        """True when some version is evaluated (a real model on the synthetic task)."""
        cfg = self.cfg
        return (
            bool(cfg.train.eval_every)
            and self.model_dir is not None
            and (cfg.task.source == "synthetic")
        )

    def due(self, version: int) -> bool:
        """True when `version` is evaluated."""
        return self.enabled and version % self.cfg.train.eval_every == 0

    def __call__(self, version: int, model: Any) -> dict[str, Any]:
        """`model()` gives the model to decode with (called only when this step evaluates)."""
        if not self.due(version):
            return {}
        if self.cfg.eval.every_steps:  # the producers evaluate (`[eval]`); the learner never waits
            return {}
        t0 = time.perf_counter()
        if self._loaded is None:
            from transformers import AutoTokenizer

            examples = make_examples("heldout", self.cfg.train.eval_size, seed=self.cfg.run.seed)
            self._loaded = (AutoTokenizer.from_pretrained(self.model_dir), examples)
        tokenizer, examples = self._loaded
        result = accuracy_of(
            model(), tokenizer, examples, max_new_tokens=self.cfg.sampling.max_new_tokens
        )
        return {"heldout_accuracy": result.accuracy, "eval_s": time.perf_counter() - t0}


def accuracy_of(
    model: Any,
    tokenizer: Any,
    examples: list[Example],
    *,
    batch_size: int = 64,
    max_new_tokens: int = 8,
) -> EvalResult:
    """Greedy accuracy of `model` on `examples` (see the module docstring)."""
    import torch

    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    device = next(model.parameters()).device
    correct = 0
    try:
        with torch.inference_mode():
            for start in range(0, len(examples), batch_size):
                batch = examples[start : start + batch_size]
                texts = _greedy(model, tokenizer, [e.prompt for e in batch], device, max_new_tokens)
                correct += sum(is_correct(t, e.answer) for t, e in zip(texts, batch, strict=True))
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return EvalResult(correct / len(examples) if examples else 0.0, correct, len(examples))


def _greedy(
    model: Any, tokenizer: Any, prompts: list[str], device: Any, max_new_tokens: int
) -> list[str]:
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    out = model.generate(
        **enc,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    new = out[:, enc["input_ids"].shape[1] :]
    return list(tokenizer.batch_decode(new, skip_special_tokens=True))


def load_snapshot(model: Any, snapshot: Path) -> None:
    """Load a snapshot file (or a directory holding `model.safetensors`) over `model`."""
    from safetensors.torch import load_file

    path = Path(snapshot)
    if path.is_dir():
        path = path / snap.WEIGHTS_FILE
    own = model.state_dict()
    dtype = next(model.parameters()).dtype
    model_shapes = {k: tuple(v.shape) for k, v in own.items()}
    storage = {k: v.data_ptr() for k, v in own.items()}
    snap.check_fits(snap.tensor_shapes(path), model_shapes, path, storage=storage)
    state = {k: v.to(dtype) for k, v in load_file(path).items()}
    # Keys left out are tied to loaded ones (checked above): fill them so the load is strict.
    for key in own:
        if key not in state:
            twin = next(k for k in state if own[k].data_ptr() == own[key].data_ptr())
            state[key] = state[twin]
    model.load_state_dict(state, strict=True)


def load_model(model_dir: Path, snapshot: Path | None = None) -> tuple[Any, Any]:
    """(model in float32 on CPU in eval mode, tokenizer) of a directory, snapshot applied."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if snapshot is not None:
        load_snapshot(model, snapshot)
    model.eval()  # type: ignore[no-untyped-call]
    return model, tokenizer


def greedy_accuracy(
    model_dir: Path,
    *,
    snapshot: Path | None = None,
    n: int | None = None,
    seed: int = 0,
    batch_size: int = 64,
    max_new_tokens: int = 8,
) -> EvalResult:
    """Greedy accuracy on the first `n` held-out problems (default: all of them)."""
    model, tokenizer = load_model(Path(model_dir), snapshot)
    examples = make_examples("heldout", n, seed=seed)
    return accuracy_of(
        model, tokenizer, examples, batch_size=batch_size, max_new_tokens=max_new_tokens
    )


def evaluate_run(run_dir: Path, model_dir: Path, *, initial: bool = True) -> dict[str, Any] | None:
    """Evaluate the snapshot `run_dir` ended with (its `final.json`; the newest on disk if it
    never ended cleanly) and the starting model; write `eval.json` and return it, or None when
    the run has no snapshot."""
    root = run_dir / RF.SNAPSHOTS
    versions = snap.list_versions(root)
    version = snap.final_version(run_dir)
    if version is None or version not in versions:
        if not versions:
            return None
        log.warning("%s has no final.json: evaluating its newest snapshot", run_dir)
        version = versions[-1]
    final = greedy_accuracy(model_dir, snapshot=snap.snapshot_dir(root, version))
    result: dict[str, Any] = {}
    if initial:
        result["initial_accuracy"] = greedy_accuracy(model_dir).accuracy
    result |= {
        "final_accuracy": final.accuracy,
        "heldout_size": final.total,
        "final_version": version,
        "model": str(model_dir),
    }
    (run_dir / RF.EVAL).write_text(json.dumps(result, indent=1))
    return result
