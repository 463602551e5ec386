"""A stand-in trainer for transport and scheduling stress tests (`train.simulate_step_s > 0`).

No model: each step sleeps `simulate_step_s` (the learner's compute time to emulate) and reports
the batch's reward statistics. Snapshots are a single small tensor whose value is the version,
so producers still fetch, verify and "load" real files. Used only with the fake engine, whose
token ids it accepts up to `VOCAB_SIZE`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.config import Config
from common.host.core_board import Share
from common.weights.adapter import AdapterHeader
from common.wire import Group, SnapshotInfo
from consumer.snapshots.weights_buffer import Fence

VOCAB_SIZE = 32_000


class SimulatedTrainer:
    """The `Trainer` (consumer/train/protocol.py) of a run without a model."""

    world_size = 1

    def __init__(self, cfg: Config) -> None:
        self.step_s = cfg.train.simulate_step_s
        self.vocab_size = VOCAB_SIZE
        self.adapter: AdapterHeader | None = None  # whole-model snapshots (a tiny stand-in)
        self.version = 0

    def step(self, groups: list[Group]) -> dict[str, Any]:
        t0 = time.perf_counter()
        time.sleep(self.step_s)
        self.version += 1
        tokens = sum(g.num_tokens for g in groups)
        return {
            "step_s": time.perf_counter() - t0,
            "num_tokens": float(tokens),
            "tis_weight_mean": 1.0,
        }

    def weights(self) -> dict[str, torch.Tensor]:
        return {"version": torch.tensor(np.array([self.version], np.float32))}

    def hold_weights(self, fence: Fence) -> None:
        """Nothing to hold: `weights()` is a new tensor each time."""

    def idle(self) -> None:
        """Nothing to keep alive."""

    def close(self) -> None:
        """Nothing to release."""

    def share_cores(self, seat: Share | None) -> None:
        """It sleeps: no threads to share."""

    def eval_model(self) -> Any:
        """Never called: the learner evaluates only a real model."""
        raise NotImplementedError("a simulated trainer has no model to evaluate")

    def save_checkpoint(self, directory: Path, *, weights: SnapshotInfo | None = None) -> None:
        """Nothing to save: a checkpoint holds only the version and the lease book."""

    def load_checkpoint(self, directory: Path) -> None:
        """Nothing to restore: the version comes from the checkpoint's `state.json`."""
