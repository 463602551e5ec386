"""Checkpoint and resume: model, optimizer, scheduler, RNG, policy version, lease book.

Layout: `<run>/checkpoint/` = `model.safetensors` (fp32), `trainer.pt` (optimizer, scheduler and
RNG states, via torch.save of plain tensors and dicts), `state.json` (version, lease book with
prompt cursor, ledger counts, and the sizes of `leases.jsonl` and `metrics.jsonl` at the save: a
resumed run truncates them there, so every lease and step appears once). Written under a
temporary name and renamed, so a crash during a save leaves the previous checkpoint intact.
`--resume` (run.resume) restores all of it: the learner continues with the same weights,
optimizer moments and RNG streams; producers notice the new incarnation and re-register by
themselves.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from common.errors import ConfigError

DIR = "checkpoint"


def save(run_dir: Path, *, trainer: Any, version: int, book_state: dict[str, Any]) -> Path:
    final = run_dir / DIR
    tmp = run_dir / f"{DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if trainer.model is not None:
        state = {k: v.detach().cpu().contiguous() for k, v in trainer.model.state_dict().items()}
        save_file(_dedup(state), tmp / "model.safetensors")
        torch.save(
            {
                "optimizer": trainer.optimizer.state_dict(),
                "scheduler": trainer.scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "python_rng": random.getstate(),
                "numpy_rng": np.random.get_state(),
            },
            tmp / "trainer.pt",
        )
    (tmp / "state.json").write_text(json.dumps({"version": version, "book": book_state}))
    for child in tmp.iterdir():
        with open(child, "rb") as f:
            os.fsync(f.fileno())
    old = run_dir / f"{DIR}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def load(run_dir: Path, *, trainer: Any) -> tuple[int, dict[str, Any]]:
    """Restore the trainer in place; returns (policy version, lease-book state)."""
    path = run_dir / DIR
    if not (path / "state.json").exists():
        raise ConfigError(f"run.resume: no checkpoint in {path} (run.dir must name an earlier run)")
    state = json.loads((path / "state.json").read_text())
    for name, size in state["book"].pop("logs", {}).items():  # drop what happened after the save
        log = run_dir / name
        if log.exists() and log.stat().st_size > size:
            with open(log, "r+b") as f:
                f.truncate(size)
    if trainer.model is not None:
        weights = load_file(path / "model.safetensors", device=str(trainer.device))
        _missing, unexpected = trainer.model.load_state_dict(weights, strict=False)
        assert not unexpected, unexpected
        extra = torch.load(path / "trainer.pt", weights_only=False)
        trainer.optimizer.load_state_dict(extra["optimizer"])
        trainer.scheduler.load_state_dict(extra["scheduler"])
        torch.set_rng_state(extra["torch_rng"])
        if extra["cuda_rng"]:
            torch.cuda.set_rng_state_all(extra["cuda_rng"])
        random.setstate(extra["python_rng"])
        np.random.set_state(extra["numpy_rng"])
    return int(state["version"]), state["book"]


def _dedup(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    seen: set[int] = set()
    out = {}
    for name, tensor in state.items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            out[name] = tensor
    return out


def record_incarnation(run_dir: Path, incarnation: int) -> None:
    """Persist a resumed run's incarnation at once: resuming twice from the same checkpoint must
    not hand out the lease ids of the first resume again."""
    path = run_dir / DIR / "state.json"
    state = json.loads(path.read_text())
    state["book"]["incarnation"] = max(int(state["book"]["incarnation"]), incarnation)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)
