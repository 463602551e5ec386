"""Checkpoint and resume: model, optimizer, scheduler, RNG, policy version, lease book.

Layout: `<run>/checkpoints/<name>/` = `model.safetensors` (fp32), `trainer.pt` (optimizer,
scheduler and RNG states, via torch.save of plain tensors and dicts), `state.json` (version,
lease book with prompt cursor, ledger counts, producer identities, and the sizes of
`leases.jsonl` and `metrics.jsonl` at the save: a resumed run truncates them there, so every
lease and step appears once); `<run>/checkpoints/LATEST` names the current one.

Crash safety (a kill or power cut at any instant leaves a checkpoint to resume from): a save
writes a new directory under a temporary name, fsyncs every file and the directory, renames it
to its unique final name, fsyncs the parent, and only then replaces `LATEST` (written to a
temporary file, fsynced, `os.replace`d, parent fsynced). Until that replace, `LATEST` names the
previous complete checkpoint; after it, the new one. Nothing a reader needs is ever renamed
away first (the former scheme renamed the old checkpoint aside before moving the new one in: a
kill between the two renames left none). Directories that `LATEST` does not name are leftovers
of an interrupted save or superseded checkpoints, removed by the next save.

What goes into the directory besides `state.json` is the trainer's own business
(`Trainer.save_checkpoint` / `load_checkpoint`, consumer/train/protocol.py): one process writes
`model.safetensors` and `trainer.pt` (`save_plain` / `load_plain` here); a sharded learner
(torchrun, world size > 1) writes `dcp/` and `rank<r>.pt` instead
(consumer/train/sharded_checkpoint.py); either layout resumes at any world size. A simulated
trainer writes nothing but `state.json`.

`--resume` (run.resume) restores all of it: the learner continues with the same weights,
optimizer moments and RNG streams; producers notice the new incarnation and re-register by
themselves. A run directory of the earlier layout (`<run>/checkpoint/`) still resumes.

Weights written once: when the snapshot of the checkpoint's version was published in float32
(`snapshot.dtype = "float32"`, what the learner holds), its `model.safetensors` already is the
checkpoint's weights, so `save_plain` hard-links it (`published=`) instead of writing the same
bytes again, and records the snapshot's BLAKE3 hash and size in `trainer.pt`; `load_plain`
checks the file against them before loading (a `ConfigError` naming the file if it changed).
The link keeps the bytes when the snapshot is pruned later. Where a link is impossible (another
filesystem) or the snapshot is bfloat16, the weights are written as before. So a run on
SmolLM2-135M in float32 keeps `snapshot.keep_last` snapshot files and one optimizer state
(1.08 GB), not a third copy of the weights (538 MB) in the checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.optim.lr_scheduler import LRScheduler

from common.errors import ConfigError, SnapshotError
from common.files import run_files as RF
from common.files.disk import from_library, writing
from common.weights.snapshot import WEIGHTS_FILE, fsync_path, sync_dir, verify_file
from common.wire import SnapshotInfo
from consumer.train.protocol import Trainer

log = logging.getLogger("asyncgrpo.consumer")
ROOT = RF.CHECKPOINTS
POINTER = "LATEST"
LEGACY_DIR = RF.LEGACY_CHECKPOINT  # before LATEST: one directory, replaced by two renames


def save(
    run_dir: Path,
    *,
    trainer: Trainer,
    version: int,
    book_state: RF.BookState,
    published: SnapshotInfo | None = None,
) -> Path:
    """Write a checkpoint and make it the current one (crash-safe; see the module doc).
    `published`: the snapshot file of this version if it holds exactly the weights (float32)."""
    assert published is None or published.version == version
    root = run_dir / ROOT
    root.mkdir(exist_ok=True)
    name = f"v{version:06d}-{uuid.uuid4().hex[:8]}"
    tmp = root / f".tmp-{name}"
    tmp.mkdir()
    try:
        with writing(tmp):
            trainer.save_checkpoint(tmp, weights=published)  # sharded: every rank's shards
            state = json.dumps({"version": version, "book": book_state.to_json()})
            (tmp / "state.json").write_text(state)
            sync_dir(tmp)
    except OSError:  # a disk fault: the current checkpoint stays; give the space back
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final = root / name
    os.rename(tmp, final)
    fsync_path(root)
    with writing(root / POINTER):
        _write_atomically(root / POINTER, name + "\n")
    for child in root.iterdir():  # earlier checkpoints and leftovers of interrupted saves
        if child.name not in (name, POINTER):
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    shutil.rmtree(run_dir / LEGACY_DIR, ignore_errors=True)
    return final


def save_plain(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    *,
    published: SnapshotInfo | None = None,
    weights: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """One process's part of a checkpoint: `model.safetensors` (fp32, tied tensors once: the
    model's state, or `weights`, e.g. a LoRA adapter's tensors only; a hard link to `published`
    when given and possible) and `trainer.pt` (optimizer, scheduler, RNG states, and the linked
    file's hash)."""
    linked = published is not None and _link(Path(published.path), directory / WEIGHTS_FILE)
    if not linked:
        source = model.state_dict() if weights is None else weights
        state = {k: v.detach().cpu().contiguous() for k, v in source.items()}
        with _library_errors(directory / WEIGHTS_FILE):
            save_file(_dedup(state), directory / WEIGHTS_FILE)
    with _library_errors(directory / "trainer.pt"):
        _save_trainer(directory, optimizer, scheduler, published if linked else None)


def _link(source: Path, target: Path) -> bool:
    """Hard-link `source` as `target`; False (and a log line) where the filesystem cannot."""
    try:
        os.link(source, target)
    except OSError as exc:
        log.info("checkpoint: writing the weights (cannot link %s: %s)", source, exc)
        return False
    return True


@contextlib.contextmanager
def _library_errors(path: Path) -> Iterator[None]:
    """A disk fault inside safetensors or torch.save raised as the OSError it was."""
    try:
        yield
    except Exception as exc:
        fault = None if isinstance(exc, OSError) else from_library(exc, path)
        if fault is None:
            raise
        raise fault from exc


def _save_trainer(
    directory: Path,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    linked: SnapshotInfo | None,
) -> None:
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "python_rng": random.getstate(),
            "numpy_rng": np.random.get_state(),
            # the weights file's BLAKE3 hash and size when it is a published snapshot's
            "weights_hash": linked.hash if linked else None,
            "weights_bytes": linked.num_bytes if linked else None,
        },
        directory / "trainer.pt",
    )


def current(run_dir: Path) -> Path | None:
    """The directory of the run's current checkpoint, or None if it has none."""
    pointer = run_dir / ROOT / POINTER
    if pointer.exists():
        path = run_dir / ROOT / pointer.read_text().strip()
        if not (path / "state.json").exists():
            raise ConfigError(f"run.resume: {pointer} names {path.name}, which is incomplete")
        return path
    legacy = run_dir / LEGACY_DIR
    return legacy if (legacy / "state.json").exists() else None


def version_of(directory: Path) -> int:
    """The policy version a checkpoint directory holds."""
    return int(json.loads((directory / "state.json").read_text())["version"])


def _write_atomically(path: Path, text: str) -> None:
    """Replace `path` by a file holding `text`: readers see the old or the new, never a part."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def load(run_dir: Path, *, trainer: Trainer) -> tuple[int, RF.BookState]:
    """Restore the trainer in place and truncate the run directory's append-only logs to their
    sizes at the save; returns (policy version, lease-book state)."""
    path = current(run_dir)
    if path is None:
        raise ConfigError(
            f"run.resume: no checkpoint in {run_dir / ROOT} (run.dir must name an earlier run)"
        )
    state = json.loads((path / "state.json").read_text())
    book = RF.BookState.from_json(state["book"])
    for name, size in book.log_sizes.items():  # drop what happened after the save
        log = run_dir / name
        if log.exists() and log.stat().st_size > size:
            with open(log, "r+b") as f:
                f.truncate(size)
    trainer.load_checkpoint(path)  # every rank, whatever world size wrote it
    return int(state["version"]), book


def load_plain(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    *,
    device: torch.device,
    restore: Callable[[dict[str, torch.Tensor]], None] | None = None,
) -> None:
    """Restore what `save_plain` wrote into one process's model (on `device`; `restore` takes
    the saved tensors instead, e.g. into a LoRA adapter), optimizer, scheduler and RNGs; weights
    linked from a snapshot are checked against its hash first."""
    extra = torch.load(directory / "trainer.pt", weights_only=False)
    path = directory / WEIGHTS_FILE
    if extra.get("weights_hash"):
        try:
            verify_file(
                path, expected_hash=extra["weights_hash"], expected_bytes=extra["weights_bytes"]
            )
        except SnapshotError as exc:
            raise ConfigError(f"run.resume: the checkpoint's weights changed: {exc}") from None
    weights = load_file(path, device=str(device))
    if restore is not None:
        restore(weights)
    else:
        _missing, unexpected = model.load_state_dict(weights, strict=False)
        assert not unexpected, unexpected
    optimizer.load_state_dict(extra["optimizer"])
    scheduler.load_state_dict(extra["scheduler"])
    torch.set_rng_state(extra["torch_rng"])
    if extra["cuda_rng"]:
        torch.cuda.set_rng_state_all(extra["cuda_rng"])
    random.setstate(extra["python_rng"])
    np.random.set_state(extra["numpy_rng"])


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
    directory = current(run_dir)
    assert directory is not None, "record_incarnation after a resume"
    path = directory / "state.json"
    state = json.loads(path.read_text())
    state["book"]["incarnation"] = max(int(state["book"]["incarnation"]), incarnation)
    _write_atomically(path, json.dumps(state))
