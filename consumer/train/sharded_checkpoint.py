"""Checkpoints of a sharded learner (torch.distributed.checkpoint), and resuming across world sizes.

Layout inside a checkpoint directory (consumer/train/checkpoint.py owns the directory, its
crash-safe rename and `state.json`):
- `dcp/`: one torch.distributed.checkpoint (DCP) of `{"model": ..., "optim": ...}`, the state
  dicts of `get_model_state_dict` / `get_optimizer_state_dict` keyed by the model's own
  parameter names (HF names): each rank writes its shards, the metadata says where every piece
  of every tensor is, so any number of ranks can read it back;
- `rank<r>.pt`: rank r's scheduler state and random-number generator states (torch, CUDA,
  Python, numpy); a rank that has none (more ranks than wrote the checkpoint) takes rank 0's.

The single-device learner writes `model.safetensors` + `trainer.pt` instead
(consumer/train/checkpoint.py). Every pairing resumes:
- sharded -> sharded, any world size, and sharded -> one process: `load` (DCP reshards; with no
  process group it reads every shard into the one process);
- one process -> sharded: `load_full` (rank 0 reads the full weights and optimizer state,
  `set_*_state_dict(..., full_state_dict=True, broadcast_from_rank0=True)` shards them).

Functions take the trainer's `model`, `optimizer` and `scheduler`; they run on every rank
together (the sharded trainer's orders see to that), or in one process.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.optim.lr_scheduler import LRScheduler

from common.errors import ConfigError
from common.weights.snapshot import sync_dir

DCP_DIR = "dcp"


# the weights a checkpoint holds: those trained (a LoRA adapter's; every weight otherwise)
_TRAINED = StateDictOptions(ignore_frozen_params=True)
_TRAINED_LOOSE = StateDictOptions(ignore_frozen_params=True, strict=False)


def _trained_state(model: torch.nn.Module) -> tuple[dict[str, Any], StateDictOptions]:
    """The model's state dict as a checkpoint holds it, and the options to set it back: every
    weight, or with frozen weights (LoRA) the trained ones only (a tied alias of a frozen
    weight, `lm_head.weight`, would otherwise come along: the base's embeddings)."""
    state = get_model_state_dict(model, options=_TRAINED)
    if all(p.requires_grad for p in model.parameters()):
        return state, _TRAINED
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in state.items() if k in trained}, _TRAINED_LOOSE


def is_sharded(directory: Path) -> bool:
    """Whether the checkpoint in `directory` was written by a sharded learner."""
    return (directory / DCP_DIR / ".metadata").exists()


def save(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    directory: Path,
    *,
    rank: int,
) -> None:
    """Every rank: its shards of model and optimizer, and its own `rank<r>.pt`; rank 0 then
    fsyncs the DCP directory (the caller waits for every rank before renaming)."""
    state = {
        "model": _trained_state(model)[0],
        "optim": get_optimizer_state_dict(model, optimizer),
    }
    torch.save(_extra(scheduler), directory / f"rank{rank}.pt")
    dcp_save(state, checkpoint_id=directory / DCP_DIR)
    if rank == 0:
        sync_dir(directory / DCP_DIR)


def load(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    directory: Path,
    *,
    rank: int,
) -> None:
    """Restore from a DCP checkpoint written by any number of ranks (here: any number too)."""
    model_state, options = _trained_state(model)
    optim = get_optimizer_state_dict(model, optimizer)
    single = not torch.distributed.is_initialized()  # one process reads every rank's shards
    with warnings.catch_warnings():  # DCP warns that no process group means one process: it does
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp_load(
            {"model": model_state, "optim": optim},
            checkpoint_id=directory / DCP_DIR,
            no_dist=single,
        )
    set_model_state_dict(model, model_state, options=options)
    set_optimizer_state_dict(model, optimizer, optim)
    own = directory / f"rank{rank}.pt"
    _restore_extra(scheduler, own if own.exists() else directory / "rank0.pt")


def load_full(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    directory: Path,
    *,
    main: bool,
) -> None:
    """Every rank: restore a single-process checkpoint (`model.safetensors`, `trainer.pt`) into
    the sharded model; rank 0 reads the tensors and they are broadcast and sharded."""
    from safetensors.torch import load_file

    if any(not p.requires_grad for p in model.parameters()):
        raise ConfigError(
            "run.resume: a LoRA checkpoint written by one process resumes in one process "
            "(dist.nproc_per_node = 1); a sharded one resumes at any world size"
        )
    extra = torch.load(directory / "trainer.pt", weights_only=False)
    weights: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    if main:
        weights = load_file(directory / "model.safetensors")
        optim = _by_name(extra["optimizer"], model)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, weights, options=options)  # tied names: one is stored
    set_optimizer_state_dict(model, optimizer, optim, options=options)
    _restore_extra(scheduler, directory / "trainer.pt")


def _by_name(optim_state: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """A single-process optimizer state dict (parameters by position, in `model.parameters()`
    order) keyed by parameter name instead, the form `set_optimizer_state_dict` takes."""
    names = [name for name, _ in model.named_parameters()]
    return {
        "state": {names[i]: s for i, s in optim_state["state"].items()},
        "param_groups": [
            {**g, "params": [names[i] for i in g["params"]]} for g in optim_state["param_groups"]
        ],
    }


def _extra(scheduler: LRScheduler) -> dict[str, Any]:
    return {
        "scheduler": scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else [],
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
    }


def _restore_extra(scheduler: LRScheduler, path: Path) -> None:
    extra = torch.load(path, weights_only=False)
    scheduler.load_state_dict(extra["scheduler"])
    torch.set_rng_state(extra["torch_rng"])
    if extra["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(extra["cuda_rng"][0])
    random.setstate(extra["python_rng"])
    np.random.set_state(extra["numpy_rng"])
