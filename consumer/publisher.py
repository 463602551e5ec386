"""Writes weight snapshots (layout and manifest: common/snapshot.py) off the training thread.

`Publisher.submit(state, version, step)` takes a CPU state dict that the trainer already copied
(so training may continue and change the live weights), and a background thread serializes it to
safetensors bytes, hashes them (BLAKE3), writes the snapshot directory atomically, prunes old
snapshots and calls `on_published(SnapshotInfo)` — which announces it. Invariants:
- Snapshots are published in version order; `submit` blocks while an earlier one is still being
  written (at most one in flight, so memory holds at most two CPU copies).
- The directory is a complete HF model directory: the base model's config and tokenizer files are
  copied next to `model.safetensors`, so `from_pretrained(snapshot_dir)` and vLLM load it as is.
- An exception in the writer thread is re-raised by the next `submit`/`wait` (never swallowed).
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save

from common import snapshot as snap
from common.wire import SnapshotInfo

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf")


class Publisher:
    def __init__(
        self,
        root: Path,
        base_model_dir: Path | None,
        *,
        keep_last: int,
        on_published: Callable[[SnapshotInfo], None],
        delay_s: float = 0.0,
    ) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._extra = [
            p
            for p in (sorted(base_model_dir.iterdir()) if base_model_dir else [])
            if p.is_file()
            and not p.name.endswith(_WEIGHT_SUFFIXES)
            and not p.name.endswith(".index.json")
        ]
        self._keep_last = keep_last
        self._delay_s = delay_s  # stress testing: a slow filesystem or network
        self._on_published = on_published
        self._jobs: queue.Queue[tuple[dict[str, torch.Tensor], int, int] | None] = queue.Queue(
            maxsize=1
        )
        self._error: BaseException | None = None
        self._idle = threading.Event()
        self._idle.set()
        self.last_write_s = 0.0
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)
        self._thread.start()

    def submit(self, state: dict[str, torch.Tensor], *, version: int, step: int) -> None:
        self._raise()
        self._idle.wait()
        self._raise()
        self._idle.clear()
        self._jobs.put((state, version, step))

    def wait(self) -> None:
        """Block until every submitted snapshot is published (or raise its error)."""
        self._idle.wait()
        self._raise()

    def close(self) -> None:
        self.wait()
        self._jobs.put(None)
        self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError("snapshot publication failed") from self._error

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                info = self.write(*job)
                if self._delay_s > 0:
                    time.sleep(self._delay_s)
                self._on_published(info)
            except BaseException as exc:  # handed to the training thread by _raise
                self._error = exc
            finally:
                self._idle.set()

    def write(self, state: dict[str, torch.Tensor], version: int, step: int) -> SnapshotInfo:
        """Serialize, hash and atomically write one snapshot; prune old ones."""
        t0 = time.perf_counter()
        data = save(state, metadata={"format": "pt"})
        digest = snap.hash_bytes(data)
        final = snap.snapshot_dir(self.root, version)
        tmp = self.root / f"{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        (tmp / snap.WEIGHTS_FILE).write_bytes(data)
        for extra in self._extra:
            shutil.copyfile(extra, tmp / extra.name)
        dtype = str(next(iter(state.values())).dtype).removeprefix("torch.")
        manifest = snap.Manifest(version, step, digest, len(data), dtype, time.time())
        snap.finalize(tmp, final, manifest)
        snap.prune(self.root, self._keep_last, protect=(version,))
        self.last_write_s = time.perf_counter() - t0
        return SnapshotInfo(version, len(data), digest, str((final / snap.WEIGHTS_FILE).resolve()))
