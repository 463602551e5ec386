"""A learner step's metrics from its micro-batches: the kept sets' mass and size, the
token-weighted combination of micro-batch metrics, and the attention layouts a step took.

Runs in the training thread (consumer/train/trainer.py and the sharded learner through it).
"""

from __future__ import annotations

import torch

from consumer.train.batching import MicroBatch
from consumer.train.lm_head import HeadOut


@torch.no_grad()
def kept_metrics(mb: MicroBatch, head: HeadOut, vocab_size: int) -> dict[str, float]:
    """Means over the micro-batch's trained tokens of the kept mass S and of |K| (the whole
    vocabulary without kept sets), and the tokens left out for an unknown kept set."""
    n = max(mb.num_tokens, 1)
    mass = float(head.log_kept_mass_N.detach().float().exp().sum()) / n
    size = float(mb.kept_valid_NK.sum()) / n if mb.kept_valid_NK is not None else vocab_size
    unknown = float(mb.num_unknown)
    return {"kept_mass_mean": mass, "kept_size_mean": size, "tokens_kept_unknown_sum": unknown}


def combine(parts: list[tuple[dict[str, float], int]]) -> dict[str, float]:
    """Token-weighted mean of micro-batch metrics; *_min / *_max combine as min / max."""
    out: dict[str, float] = {}
    parts = [(m, n) for m, n in parts if n > 0] or parts[:1]  # empty micro-batches say nothing
    total = sum(n for _, n in parts) or 1
    for key in parts[0][0]:
        values = [m[key] for m, _ in parts if key in m]
        if key.endswith("_min"):
            out[key] = min(values)
        elif key.endswith("_max"):
            out[key] = max(values)
        elif key == "num_tokens" or key.endswith("_sum"):
            out[key] = float(sum(values))
        else:
            out[key] = sum(m[key] * n for m, n in parts if key in m) / total
    return out


def layouts(path: str, shared_passes: float, passes: int) -> str:
    """The step's `attention` metric: the path, or with `shared_prompt` the layouts its passes
    took (`shared_prompt`, `padded`, or `shared_prompt+padded`)."""
    if path != "shared_prompt" or shared_passes == passes:
        return path
    return "padded" if shared_passes == 0 else "shared_prompt+padded"
