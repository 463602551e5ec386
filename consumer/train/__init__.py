"""One optimizer step, run by the consumer's main (training) thread: on one device, or on every
rank of an FSDP2 learner under torchrun (ranks > 0 run nothing else).

What it owns: the `Trainer` protocol (consumer/train/protocol.py) and its implementations (one
device: trainer.py; FSDP2: sharded.py with ranks.py; no model: simulated.py), the loss and the
advantages (pure tensor functions: loss.py, advantages.py; their options from the config:
options.py; a batch's: batch_advantages.py),
batching.py, the forward over completion tokens (forward.py) with its LM head (lm_head.py) and
attention choice (attention.py; a group's prompt once: shared_prompt.py), the core board's
threads taken again before every decoder layer (layer_threads.py), a step's metrics
(step_metrics.py), the learning-rate schedule (schedule.py), a LoRA adapter on the frozen base
(adapter.py), how its process gives freed memory back (host_memory.py), and checkpoints
(checkpoint.py; sharded: sharded_checkpoint.py). What it does not do: sockets, leases or snapshots
on disk (consumer/server/, consumer/snapshots/); only the learner (consumer/learner.py) calls it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from common.config import Config
    from consumer.train.ranks import World
    from consumer.train.trainer import DeviceTrainer


def make_trainer(cfg: Config, model_dir: Path, world: World | None = None) -> DeviceTrainer:
    """The single-device `DeviceTrainer` at world size 1, else a `ShardedTrainer` (in the
    group of torchrun's ranks). Imports torch and transformers only when called."""
    from consumer.train.ranks import World
    from consumer.train.sharded import ShardedTrainer
    from consumer.train.trainer import DeviceTrainer

    world = world or World.from_env()
    if world.size == 1:
        return DeviceTrainer(cfg, model_dir)
    return ShardedTrainer(cfg, model_dir, world)
