"""The learning-rate schedule: the factor of `train.lr` at each optimizer update (pure).

Updates are counted from 0 (`update` = optimizer updates taken before this one); a learner step
takes `train.updates_per_batch` of them, so the run's horizon is
T = `run.steps` x `train.updates_per_batch` updates, and W = `train.warmup_steps` counts updates
too (learner steps, with one update per batch, the default). With m = `train.lr_min_ratio`:

    warm-up (u < W):   f(u) = (u + 1) / W                 lr / W at the first update, lr at the W-th
    then               p(u) = min(1, (u - W) / max(1, T - W - 1))     0 after warm-up, 1 at the last
      constant:        f(u) = 1
      linear:          f(u) = m + (1 - m) * (1 - p)
      cosine:          f(u) = m + (1 - m) * (1 + cos(pi * p)) / 2

so a decaying schedule reaches lr * m at the last update of the run and stays there after it.

The trainers hold it as a `torch.optim.lr_scheduler.LambdaLR` (`make_scheduler`), stepped once
per update; its state (the count of updates taken) is in every checkpoint, so a resumed run
continues the curve where it stopped (the same curve: it is drawn from the config, so a resume
with other `train.*` schedule keys or another `run.steps` continues on the new one).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from common.config import Config
from common.config.fields import LRSchedule


def lr_factor(
    update: int, *, schedule: LRSchedule, warmup: int, total: int, min_ratio: float
) -> float:
    """The factor of the peak lr at optimizer update `update` (see the module doc)."""
    if update < warmup:
        return (update + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (update - warmup) / max(1, total - warmup - 1))
    cosine = (1.0 + math.cos(math.pi * progress)) / 2
    shape = 1.0 - progress if schedule == "linear" else cosine
    return min_ratio + (1.0 - min_ratio) * shape


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: Config) -> Any:
    """The `LambdaLR` of the run's schedule on `optimizer` (whose lr is the peak, `train.lr`)."""
    t = cfg.train
    total = cfg.run.steps * t.updates_per_batch
    options = dict(
        schedule=t.lr_schedule, warmup=t.warmup_steps, total=total, min_ratio=t.lr_min_ratio
    )
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda update: lr_factor(update, **options),  # type: ignore[arg-type]
    )
