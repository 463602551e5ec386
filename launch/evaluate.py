"""Greedy held-out accuracy of a model directory or snapshot on the synthetic task.

`greedy_accuracy(model_dir, snapshot=...)` loads `model_dir` (config, tokenizer, weights), then,
if given, the snapshot's `model.safetensors` over the weights (cast to the model's dtype, tied
parameters may be absent). `accuracy_of(model, tokenizer, examples)` does the decoding for a
model already in memory (the learner's periodic evaluation). Greedy decoding, batched with left
padding; a completion ends at EOS or after `max_new_tokens`; `common.tasks.is_correct` judges.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from common.tasks import Example, is_correct, make_examples


@dataclass(frozen=True, slots=True)
class EvalResult:
    accuracy: float
    correct: int
    total: int


@torch.inference_mode()
def accuracy_of(
    model: Any, tokenizer: Any, examples: list[Example], *, batch_size: int = 256, max_new_tokens: int = 6
) -> EvalResult:
    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    device = next(model.parameters()).device
    correct = 0
    try:
        for start in range(0, len(examples), batch_size):
            batch = examples[start : start + batch_size]
            enc = tokenizer([e.prompt for e in batch], return_tensors="pt", padding=True).to(device)
            out = model.generate(
                **enc,
                do_sample=False,
                use_cache=True,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            correct += sum(is_correct(t, e.answer) for t, e in zip(texts, batch, strict=True))
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return EvalResult(correct / max(len(examples), 1), correct, len(examples))


def load_model(model_dir: Path, snapshot: Path | None = None) -> tuple[Any, Any]:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if snapshot is not None:
        state = {k: v.to(torch.float32) for k, v in load_file(snapshot).items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        own = model.state_dict()
        present = {own[k].data_ptr() for k in state if k in own}
        untied = [k for k in missing if own[k].data_ptr() not in present]
        if unexpected or untied:
            raise ValueError(f"{snapshot} does not fit {model_dir}: {unexpected[:3]} {untied[:3]}")
    return model, tokenizer


def greedy_accuracy(
    model_dir: Path, *, snapshot: Path | None = None, n: int | None = None, seed: int = 0, batch_size: int = 256
) -> EvalResult:
    model, tokenizer = load_model(Path(model_dir), snapshot)
    examples = make_examples("heldout", n if n is not None else 10**9, seed=seed)
    return accuracy_of(model, tokenizer, examples, batch_size=batch_size)
