"""What a snapshot carries for producers that fetch it over the network: its chunk hashes and, for
versions that are not anchors, a sparse delta on the previously written version.

`Distribution.prepare(directory, data, version=, file_hash=)` runs on the publisher's writer
thread (never the training thread), right after `model.safetensors` was written from the
publication buffer `data` and before the buffer is released or the directory renamed. It
writes into the snapshot's temporary directory:

- `chunks.json` (common/chunk_manifest.py): per-chunk BLAKE3 digests of `model.safetensors`
  and, when written, of `weights.delta`;
- `weights.delta` (common/delta.py): version v on the last version written before it (its base;
  with superseded versions that may be older than v-1), unless v is an **anchor**.

Anchors: the first version written, every version at least `anchor_every` after the previous
anchor, any version whose layout differs from its base's, and any version whose delta would
exceed `max_ratio` of the full file (then the delta is not written: it would not be much smaller).

Every version keeps its full `model.safetensors` on the consumer's disk (loaders, evaluation,
resume and same-host producers read it as before), so a delta's base only matters to a producer:
one that holds exactly the base takes the delta; any other takes the full file of the newest
version (never more bytes than an anchor plus the deltas after it). Nothing on the consumer's
disk depends on an older snapshot, so keep-last rotation and resume need no extra care.

The previous version is read back from its file (the page cache) through a read-only memory map:
no extra copy of the weights is held in memory.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common import chunk_manifest as cm
from common import delta as D
from common import snapshot as snap
from common.config import Config

log = logging.getLogger("asyncgrpo.consumer")


@dataclass(frozen=True, slots=True)
class DeltaRecord:
    """The delta written next to a snapshot: base version and file hash, size."""

    base_version: int
    hash: str
    num_bytes: int
    elements_changed: int


class Distribution:
    def __init__(self, *, chunk_bytes: int, anchor_every: int, max_ratio: float) -> None:
        assert chunk_bytes > 0
        self.chunk_bytes = chunk_bytes
        self.anchor_every = anchor_every  # 0 = deltas off: every version is an anchor
        self.max_ratio = max_ratio
        self._last: tuple[int, Path, str] | None = None  # version, final weights path, hash
        self._last_anchor = -(1 << 62)
        self.last_delta_s = 0.0
        self.num_deltas = self.num_anchors = 0
        self.delta_bytes = self.full_bytes = 0  # totals, for the metrics

    def prepare(
        self, directory: Path, data: memoryview, *, version: int, file_hash: str
    ) -> DeltaRecord | None:
        """Write `chunks.json` (and `weights.delta` unless `version` is an anchor) into the
        snapshot's temporary `directory`; returns the delta written, if any."""
        t0 = time.perf_counter()
        files = {"weights": cm.chunk_hashes(data, self.chunk_bytes)}
        record = self._delta(directory, data, version, file_hash)
        if record is not None:
            delta_data = (directory / D.DELTA_FILE).read_bytes()
            files["delta"] = cm.chunk_hashes(delta_data, self.chunk_bytes)
            self.num_deltas += 1
            self.delta_bytes += record.num_bytes
        else:
            self.num_anchors += 1
            self._last_anchor = version
        self.full_bytes += len(data)
        cm.write_chunks(directory, files)
        self.last_delta_s = time.perf_counter() - t0
        return record

    def written(self, version: int, weights: Path, file_hash: str) -> None:
        """The snapshot `version` is complete at `weights` (the next delta's base)."""
        self._last = (version, weights, file_hash)

    def _delta(
        self, directory: Path, data: memoryview, version: int, file_hash: str
    ) -> DeltaRecord | None:
        last = self._last
        if (
            self.anchor_every <= 0
            or last is None
            or version - self._last_anchor >= self.anchor_every
        ):
            return None
        base_version, base_path, base_hash = last
        new = np.frombuffer(data, dtype=np.uint8)
        try:
            base = np.memmap(base_path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            log.warning("no delta for v%d: base v%d unreadable (%s)", version, base_version, exc)
            return None
        try:
            layout = D.read_layout(new)
            patches = D.diff(layout, base, new)
        except D.DeltaError as exc:
            log.info("v%d is an anchor: %s", version, exc)
            return None
        finally:
            del base
        delta = D.Delta(base_version, version, base_hash, file_hash, tuple(patches))
        header, arrays = D.encode_delta(layout, delta)
        size = D.delta_bytes(header, arrays)
        if size > self.max_ratio * len(new):
            return None
        digest = D.write_delta(directory / D.DELTA_FILE, header, arrays)
        changed = sum(len(p.values) for p in patches)
        return DeltaRecord(base_version, digest, size, changed)


def delta_of(manifest: snap.Manifest) -> tuple[int, str, int] | None:
    """(base version, hash, bytes) of the delta a snapshot carries, or None for an anchor."""
    if manifest.delta_base < 0:
        return None
    return manifest.delta_base, manifest.delta_hash, manifest.delta_bytes


def snapshot_chunk_bytes(cfg: Config) -> int:
    """The chunk size of fetches over the network: `snapshot.chunk_mib`, and small enough for
    one chunk reply to fit a message (`net.max_message_mib`, with room for the envelope)."""
    mib = 1 << 20
    return max(1, min(int(cfg.snapshot.chunk_mib * mib), int(cfg.net.max_message_mib * mib) - 4096))
