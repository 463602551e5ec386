"""Publishes weight snapshots (layout and manifest: common/weights/snapshot.py) at memory speed.

`Publisher.submit(state, version=, step=, dtype=)` is all the training thread pays: one copy of
the weights into a preallocated host buffer that already holds the safetensors header
(consumer/snapshots/weights_buffer.py; on CUDA the copy is only enqueued on a side stream and
`submit` returns its `Fence`, which the optimizer step must hold before changing the weights). A
writer thread then waits for the copy, writes the buffer's bytes as `model.safetensors` while
hashing the same memory (BLAKE3), copies the base model's config and tokenizer files next to it,
finalizes the directory atomically, calls `on_published(SnapshotInfo)`, which announces it, then
adds what network fetchers need (chunk hashes and, between anchors, a sparse delta on the
previous version: consumer/snapshots/fetch_files.py), and only then prunes old snapshots (deleting a
large file takes a while and nobody waits for it).

Never queue behind a slow writer: there are up to two buffers (`Buffers`, a small state
machine). A copy goes to a free buffer; while one buffer is being written and the other holds a
version still waiting for the writer, the next copy replaces that waiting version, which is
then *superseded*: never written, never announced, counted in `num_superseded`. A buffer is
free again as soon as its bytes are in the file (before the fsyncs and the rename). The second
buffer is allocated only the first time a copy finds the first one still in use (logged): a
writer that keeps up with the steps, as on a CPU where a step takes seconds and a write a
fraction of one, costs one buffer of host memory, not two (on SmolLM2-135M in float32, 538 MB).
On a CPU whose weights are already in the snapshot dtype (a float32 learner publishing float32,
`LIVE_MIN_BYTES` or more) there is no buffer at all: the writer writes and hashes the header and
the live tensors (`LiveWeights`), and the fence `submit` returns (`WrittenFence`) holds the next
optimizer step until it has read them; a write takes a fraction of such a model's CPU step, so
that step rarely waits, and the learner holds no copy of its weights (SmolLM2-135M: 538 MB).

What superseding means for staleness: nothing for the bound. Leases for step s are granted only
while s - max_staleness <= the newest *published* version (consumer/server/leases.py), so a skipped
version only means producers go from v to v+2 directly; if the writer falls behind by more
than max_staleness steps, lease grants pause until it catches up, and the cost shows as learner
idle time, never as staler groups. `publish_every` therefore states the most frequent
publication, not a promise that every such version appears on disk.

Invariants:
- Snapshots appear and are announced in increasing version order; the newest submitted version
  is always written (only older waiting ones are superseded); `wait()` returns when it is.
- The directory is a complete HF model directory: the base model's config and tokenizer files are
  copied next to `model.safetensors`, so `from_pretrained(snapshot_dir)` and vLLM load it as is.
  With `adapter` (LoRA) it is a peft adapter directory instead: the file's header names the
  adapter and its base (common/weights/adapter.py), `adapter_config.json` sits beside it; every
  version is an anchor (no delta: common/weights/adapter.py says why), chunk hashes as ever.
- The manifest records this host's id (`common.weights.snapshot.host_id`), so a producer on the same
  host may take the hash instead of reading the whole file again.
- An exception in the writer thread is re-raised by the next `submit`/`wait` (never swallowed).

The fsync policy (`snapshot.fsync`): `before_announce` (default) fsyncs the weights (hashing
meanwhile), every file, the directory and, after the rename, the parent, then announces: a snapshot
is durable before anyone hears of it. `after_announce` renames and announces first, then fsyncs the
same set: producers on this host read it from the page cache while it is made durable. `off` never
fsyncs. Either way a reader never sees a partial directory (the rename is atomic); after a power
loss a snapshot that was not yet durable may hold torn bytes, which no reader loads: its hash
disagrees, and a manifest's hash is only taken without reading the file by a reader on the same host
*and boot* (common/weights/snapshot.py). A resumed consumer publishes its current version anew at
start.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from common.config import SnapshotFsync, choices
from common.files.disk import writing
from common.weights import adapter as adapter_format
from common.weights import snapshot as snap
from common.weights.adapter import AdapterHeader
from common.weights.tensor_table import TensorTable
from common.wire import SnapshotInfo
from consumer.snapshots.fetch_files import FetchFiles
from consumer.snapshots.weights_buffer import (
    Fence,
    HostCopier,
    HostWeights,
    LiveWeights,
    WrittenFence,
    live_ok,
    table_for,
    unique_tensors,
)

log = logging.getLogger("asyncgrpo.consumer")
LIVE_MIN_BYTES = 64 << 20  # CPU weights this large in the snapshot dtype are written as they are
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf")


@dataclass(frozen=True, slots=True)
class Job:
    """A version copied (or being copied, until `fence`) into a buffer, waiting to be written."""

    version: int
    step: int
    dtype: str  # "bfloat16" | "float32"
    fence: Fence


class Buffers:
    """Which buffer a copy goes to and which one the writer takes (no threads, no I/O).

    Each buffer is free, being filled, pending (holds a `Job`) or being written. Buffers are
    made when first needed, at most `limit`: `claim` takes a free one, else makes one, else
    supersedes the oldest pending. With one writer and a limit of at least two, it always
    finds one: the copy never waits.
    """

    def __init__(self, limit: int) -> None:
        assert limit >= 2
        self.limit = limit
        self.count = 0  # buffers made so far
        self.free: list[int] = []
        self.pending: dict[int, Job] = {}
        self.filling: int | None = None
        self.writing: int | None = None

    def claim(self) -> tuple[int, Job | None]:
        """A buffer for the next copy (`count` grows when it is a new one), and the job it
        supersedes (the oldest pending) if any."""
        assert self.filling is None, "one copy at a time"
        if self.free:
            self.filling = self.free.pop(0)
            return self.filling, None
        if self.count < self.limit:
            self.filling = self.count
            self.count += 1
            return self.filling, None
        assert self.pending, "every buffer is being written"
        index = min(self.pending, key=lambda i: self.pending[i].version)
        self.filling = index
        return index, self.pending.pop(index)

    def fill(self, index: int, job: Job) -> None:
        assert self.filling == index
        self.filling = None
        self.pending[index] = job

    def abandon(self, index: int) -> None:
        """The copy into `index` failed: the buffer is free again."""
        assert self.filling == index
        self.filling = None
        self.free.append(index)

    def ready(self) -> bool:
        """True when the writer has a buffer to take."""
        return self.writing is None and bool(self.pending)

    def take(self) -> tuple[int, Job] | None:
        """The writer's next buffer: the pending one with the lowest version."""
        if self.writing is not None or not self.pending:
            return None
        index = min(self.pending, key=lambda i: self.pending[i].version)
        self.writing = index
        return index, self.pending.pop(index)

    def release(self, index: int) -> None:
        assert self.writing == index
        self.writing = None
        self.free.append(index)

    def idle(self) -> bool:
        return not self.pending and self.filling is None and self.writing is None


class Publisher:
    def __init__(
        self,
        root: Path,
        base_model_dir: Path | None,
        *,
        keep_last: int,
        on_published: Callable[[SnapshotInfo], None],
        delay_s: float = 0.0,
        fsync: SnapshotFsync = "before_announce",
        num_buffers: int = 2,
        fetch_files: FetchFiles | None = None,
        adapter: AdapterHeader | None = None,
        live_min_bytes: int = LIVE_MIN_BYTES,
    ) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._adapter = adapter  # the versions are this LoRA adapter's (common/weights/adapter.py)
        self._base_name = str(base_model_dir or "")
        self._extra = [
            p
            for p in (sorted(base_model_dir.iterdir()) if base_model_dir and not adapter else [])
            if p.is_file()
            and not p.name.endswith(_WEIGHT_SUFFIXES)
            and not p.name.endswith(".index.json")
        ]
        self._keep_last = keep_last
        self._delay_s = delay_s  # stress testing: a slow filesystem or network
        if fsync not in choices(SnapshotFsync):
            modes = ", ".join(choices(SnapshotFsync))
            raise ValueError(f"snapshot.fsync must be one of {modes}: {fsync!r}")
        self._fsync = fsync
        self._on_published = on_published
        self.fetch_files = fetch_files or FetchFiles(
            chunk_bytes=4 << 20, anchor_every=0, max_ratio=0.5
        )
        if adapter is not None:  # every element of an adapter changes each step: no deltas
            self.fetch_files.anchor_every = 0
        self._copier = HostCopier()
        self._live_min_bytes = live_min_bytes
        self._hosts: list[HostWeights | LiveWeights] = []  # made as `Buffers` needs them
        self._buffers = Buffers(num_buffers)
        self._cond = threading.Condition()
        self._announcing = False  # the writer is past the buffer: fsync, rename, announce
        self._closing = False
        self._error: BaseException | None = None
        self.num_superseded = 0
        self.last_write_s = 0.0  # the last snapshot: copy done -> ready to announce
        self.last_prune_s = 0.0  # the last rotation (after the announcement)
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)
        self._thread.start()

    # -- the training thread -------------------------------------------------------------------
    def submit(
        self,
        state: Mapping[str, torch.Tensor],
        *,
        version: int,
        step: int,
        dtype: torch.dtype | None = None,
    ) -> Fence:
        """Copy `state` (HF names, on any one device; floating-point tensors stored in `dtype`,
        None = as they are) for publication as `version`; returns at once on CUDA. Hold the
        returned fence (`Fence.hold_stream`) before changing the weights."""
        self._raise()
        tensors = unique_tensors(state)
        with self._cond:
            index, superseded = self._buffers.claim()
        if superseded is not None:
            self._superseded(superseded, version)
        try:
            host = self._host_for(index, tensors, dtype)
            fence = (
                WrittenFence()
                if isinstance(host, LiveWeights)
                else self._copier.copy(tensors, host)
            )
        except BaseException:
            with self._cond:
                self._buffers.abandon(index)
            raise
        if dtype is None:
            dtype = next((t.dtype for t in tensors.values() if t.is_floating_point()), None)
        job = Job(version, step, str(dtype).removeprefix("torch."), fence)
        with self._cond:
            self._buffers.fill(index, job)
            self._cond.notify_all()
        return fence

    @property
    def num_buffers(self) -> int:
        """Host buffers made so far (each a whole snapshot file in memory; none while every
        version is written from the live weights)."""
        return sum(isinstance(h, HostWeights) for h in self._hosts)

    @property
    def buffer_bytes(self) -> int:
        """The size of one host buffer (0 before the first submit, or with none)."""
        return next((h.table.num_bytes for h in self._hosts if isinstance(h, HostWeights)), 0)

    def _host_for(
        self, index: int, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype | None
    ) -> HostWeights | LiveWeights:
        """What buffer `index` writes this version from: the live weights themselves where
        `live_ok`, else a host buffer (made the first time it is needed)."""
        table = self._hosts[0].table if self._hosts else self._table(tensors, dtype)
        host: HostWeights | LiveWeights
        if live_ok(tensors, dtype, self._live_min_bytes):
            host = LiveWeights(table, tensors)
        elif index < len(self._hosts) and isinstance(self._hosts[index], HostWeights):
            return self._hosts[index]
        else:
            if self.num_buffers:
                log.info(
                    "a second snapshot host buffer (%d MB): the writer still held the first when "
                    "the next version was copied (it is slower than publish_every steps)",
                    table.num_bytes >> 20,
                )
            pin = next(iter(tensors.values())).is_cuda and torch.cuda.is_available()
            host = HostWeights(table, pin=pin)
        if index == len(self._hosts):
            self._hosts.append(host)
        else:
            self._hosts[index] = host
        return host

    def _table(self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype | None) -> TensorTable:
        meta = (
            adapter_format.metadata(self._adapter.spec, self._adapter.base_hash)
            if self._adapter
            else None
        )
        return table_for(tensors, dtype, metadata=meta)

    def wait(self) -> None:
        """Block until every submitted snapshot is published or superseded (or raise its error)."""
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None or self._quiet())
        self._raise()

    def wait_queued(self) -> None:
        """Block until no submitted version waits for the writer (one may still be in writing),
        so that the next `submit` supersedes nothing; raise the writer's error if any."""
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None or not self._buffers.pending)
        self._raise()

    def close(self) -> None:
        self.wait()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()

    def _quiet(self) -> bool:
        return self._buffers.idle() and not self._announcing

    def _superseded(self, job: Job, by: int) -> None:
        _released(job)  # never written: the weights may change
        self.num_superseded += 1
        if self.num_superseded == 1 or self.num_superseded % 100 == 0:
            log.warning(
                "snapshot v%d superseded by v%d before it was written (%d so far): the writer "
                "is slower than publish_every steps; producers skip to the newer version",
                job.version,
                by,
                self.num_superseded,
            )

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError("snapshot publication failed") from self._error

    # -- the writer thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closing or self._buffers.ready())
                taken = self._buffers.take()
                if taken is None:
                    return  # closing, and nothing left to write
                self._announcing = True
            index, job = taken
            try:
                info = self._write(index, job)
                if self._delay_s > 0:
                    time.sleep(self._delay_s)
                self._on_published(info)
                directory = Path(info.path).parent
                self.fetch_files.prepare(directory, version=job.version, file_hash=info.hash)
                if self._fsync == "after_announce":
                    snap.sync_dir(directory)
                    snap.fsync_path(directory.parent)
                t0 = time.perf_counter()
                snap.prune(self.root, self._keep_last, protect=(job.version,))
                self.last_prune_s = time.perf_counter() - t0
            except BaseException as exc:  # handed to the training thread by _raise
                self._error = exc
            finally:
                _released(job)
                with self._cond:
                    if self._buffers.writing == index:
                        self._buffers.release(index)
                    self._announcing = False
                    self._cond.notify_all()

    def _write(self, index: int, job: Job) -> SnapshotInfo:
        """Write one buffer as a snapshot directory (atomically); free the buffer."""
        job.fence.wait()
        t0 = time.perf_counter()
        host = self._hosts[index]
        final = snap.snapshot_dir(self.root, job.version)
        tmp = self.root / f"{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        durable_first = self._fsync == "before_announce"
        path = tmp / snap.WEIGHTS_FILE
        try:
            with writing(path):
                digest = snap.write_file(path, host.file_parts(), fsync=durable_first)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # a disk fault: give its space back
            raise
        finally:
            _released(job)  # the weights may change now
            with self._cond:  # the bytes are in the file: the next copy may use this buffer
                self._buffers.release(index)
                self._cond.notify_all()
        try:
            with writing(tmp):
                for extra in self._extra:
                    shutil.copyfile(extra, tmp / extra.name)
                if self._adapter is not None:  # peft's names for the same file, and its config
                    adapter_format.write_peft_files(tmp, self._adapter, self._base_name)
                num_bytes = host.table.num_bytes
                manifest = snap.Manifest(
                    version=job.version,
                    step=job.step,
                    hash=digest,
                    num_bytes=num_bytes,
                    dtype=job.dtype,
                    created_unix=time.time(),
                    writer=snap.host_id(),
                    base_hash=self._adapter.base_hash if self._adapter else "",
                )
                snap.finalize(tmp, final, manifest, fsync=durable_first)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.last_write_s = time.perf_counter() - t0
        weights = str((final / snap.WEIGHTS_FILE).resolve())
        return SnapshotInfo(version=job.version, num_bytes=num_bytes, hash=digest, path=weights)


def _released(job: Job) -> None:
    """The writer will not read `job`'s live weights again (nothing for a host buffer's)."""
    if isinstance(job.fence, WrittenFence):
        job.fence.release()
