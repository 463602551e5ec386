"""What the learner needs of a trainer: the `Trainer` protocol, on the training thread.

Three implementations: `DeviceTrainer` (consumer/train/trainer.py, one device), `ShardedTrainer`
(consumer/train/sharded.py: FSDP2, rank 0 drives the others) and `SimulatedTrainer`
(consumer/train/simulated.py: no model, for transport stress tests). The learner
(consumer/learner.py) and the checkpoint directory (consumer/train/checkpoint.py) see only this
protocol: each trainer writes and reads its own part of a checkpoint (`save_checkpoint`,
`load_checkpoint`), so nobody asks which kind of trainer it holds.

Conventions:
- `step` consumes one batch of groups (one optimizer step, or `train.updates_per_batch`) and
  returns that step's metrics, fields of `common.files.metrics.StepRecord` by name.
- `weights()` are the policy's tensors by Hugging Face parameter name (tied names share one
  tensor), for publication (with LoRA, `adapter` set: the adapter's tensors only, by peft's
  file names); they stay as they are until the next `step`, which first waits
  for the fence `hold_weights` was given (a copy of them still in flight).
- `save_checkpoint(directory, weights=info)` / `load_checkpoint(directory)` write and read the
  model, optimizer, scheduler and RNG states inside a checkpoint directory the caller owns (its
  crash-safe rename, `state.json` and the lease book are consumer/train/checkpoint.py's).
  `weights`, when given, is a published snapshot file holding exactly the current weights (the
  same version, float32): a trainer that stores weights as one file links it instead of
  writing them again (and checks its hash when it resumes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from common.host.core_board import Share
from common.weights.adapter import AdapterHeader
from common.wire import Group, SnapshotInfo
from consumer.snapshots.weights_buffer import Fence


class Trainer(Protocol):
    """The learner's model and optimizer step, whatever runs them."""

    vocab_size: int  # rows of the input embeddings: token ids a group may hold
    adapter: AdapterHeader | None  # LoRA: what `weights()` are an adapter of; None: the model

    @property
    def world_size(self) -> int:
        """Ranks training this policy together (1: one process)."""
        ...

    def step(self, groups: list[Group]) -> dict[str, Any]:
        """One optimizer step on `groups` (advantages, loss, update); its metrics."""
        ...

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's current weights by HF name, for publication (rank 0)."""
        ...

    def hold_weights(self, fence: Fence) -> None:
        """Keep `weights()` unchanged until `fence` (a copy of them) completes."""
        ...

    def eval_model(self) -> Any:
        """A transformers model with the current weights that `generate` can run here."""
        ...

    def idle(self) -> None:
        """Called while the learner waits for groups (keeps other ranks alive)."""
        ...

    def close(self) -> None:
        """The run is over: release what the trainer holds (tell other ranks to stop)."""
        ...

    def share_cores(self, seat: Share | None) -> None:
        """Take the torch threads `seat` (on this host's cores, shared with the run's other
        processes: common/host/core_board.py; or a recording) gives before each unit of work (None:
        as configured); ignored where the trainer does not compute on the host's cores."""
        ...

    def save_checkpoint(self, directory: Path, *, weights: SnapshotInfo | None = None) -> None:
        """Write the trainer's state into the new checkpoint `directory` (every rank's part);
        `weights`: a published file that holds exactly the current weights, if any."""
        ...

    def load_checkpoint(self, directory: Path) -> None:
        """Restore the trainer's state from checkpoint `directory`, whatever wrote it."""
        ...
