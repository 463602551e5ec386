"""Greedy held-out accuracy on the synthetic task: the rule every greedy evaluation shares.

Greedy decoding (no sampling) of the prompts of `common.task.synthetic`'s held-out split, batched
with left padding, each completion ending at EOS or after `max_new_tokens`, judged by
`common.task.synthetic.is_correct` on the decoded text (special tokens removed). Does not train
or sample; never touches the train split.

- `load_model(model_dir, snapshot)` loads `model_dir` (config, tokenizer, weights) in float32
  and, if given, a snapshot's `model.safetensors` over the weights: every tensor is cast to the
  model's dtype, after `common.weights.snapshot.check_fits` (the engines' rule: names and shapes
  agree, tied embeddings may be stored once) or a `SnapshotError`.
- `accuracy_of(model, tokenizer, examples)` decodes with a model already in memory and leaves
  its train/eval mode and the tokenizer's padding side as they were.
- `accuracy_fields(result, seconds)`: the metrics.jsonl fields of one evaluation
  (`heldout_accuracy`, `eval_s`), whichever thread or process measured it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.task.synthetic import Example, is_correct
from common.weights import snapshot as snap


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
    progress: Callable[[int], None] | None = None,
) -> EvalResult:
    """Greedy accuracy of `model` on `examples` (see the module docstring); `progress` is told
    the examples done after each batch."""
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
                if progress is not None:
                    progress(start + len(batch))
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


def load_snapshot(model: Any, snapshot: Path, base_dir: Path) -> None:
    """Load a snapshot file (or a directory holding `model.safetensors`) over `model`, whose
    weights are `base_dir`'s; a LoRA run's snapshot (an adapter) is merged into them
    (common/weights/adapter_merge.py; one of another base is refused)."""
    from safetensors.torch import load_file

    from common.weights.adapter_merge import merge_file

    path = Path(snapshot)
    if path.is_dir():
        path = path / snap.WEIGHTS_FILE
    if merge_file(model, path, base_dir) is not None:
        return
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
        load_snapshot(model, snapshot, Path(model_dir))
    model.eval()  # type: ignore[no-untyped-call]
    return model, tokenizer


def accuracy_fields(result: EvalResult, seconds: float) -> dict[str, float]:
    """One evaluation's metrics.jsonl fields (`StepRecord.heldout_accuracy`, `eval_s`)."""
    return {"heldout_accuracy": result.accuracy, "eval_s": seconds}
