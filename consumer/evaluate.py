"""Greedy held-out accuracy of a model directory or snapshot on the synthetic task.

Owns the evaluation rule the launcher, `asyncgrpo eval` and the learner's periodic evaluation
share: greedy decoding (no sampling) of the prompts of `common.tasks`' held-out split, batched
with left padding, each completion ending at EOS or after `max_new_tokens`, judged by
`common.tasks.is_correct` on the decoded text (special tokens removed). Does not train or
sample; never touches the train split.

- `greedy_accuracy(model_dir, snapshot=...)` loads `model_dir` (config, tokenizer, weights) in
  float32 and, if given, a snapshot `model.safetensors` over the weights: every tensor is cast to
  the model's dtype; every file key must name a model parameter or buffer (shapes must agree),
  and every model key must be in the file or share storage with one that is (tied embeddings may
  be stored once). Anything else is a `SnapshotMismatch` (a `ValueError`).
- `accuracy_of(model, tokenizer, examples)` decodes with a model already in memory and leaves
  its train/eval mode and the tokenizer's padding side as they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.tasks import Example, is_correct, make_examples

WEIGHTS_FILE = "model.safetensors"


class SnapshotMismatch(ValueError):
    """A snapshot's tensors do not fit the model they are loaded over."""


@dataclass(frozen=True, slots=True)
class EvalResult:
    accuracy: float
    correct: int
    total: int


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
        path = path / WEIGHTS_FILE
    own = model.state_dict()
    dtype = next(model.parameters()).dtype
    state = load_file(path)
    unexpected = sorted(k for k in state if k not in own)
    wrong_shape = sorted(k for k in state if k in own and state[k].shape != own[k].shape)
    present = {own[k].data_ptr() for k in state if k in own}
    missing = sorted(k for k in own if k not in state and own[k].data_ptr() not in present)
    if unexpected or wrong_shape or missing:
        raise SnapshotMismatch(
            f"{path} does not fit the model: unexpected {unexpected[:3]}, "
            f"wrong shape {wrong_shape[:3]}, missing {missing[:3]}"
        )
    state = {k: v.to(dtype) for k, v in state.items()}
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
    model.eval()
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
