"""What a snapshot carries for producers that fetch it over the network: its chunk hashes and, for
versions that are not anchors, a sparse delta on the previously written version.

`FetchFiles.prepare(directory, version=, file_hash=)` runs on the publisher's writer thread
(never the training thread) just *after* the snapshot was announced, so producers that read the
file from a shared filesystem (the learner's own host included) never wait for it. It maps
`model.safetensors` (just written from the publication buffer: page-cache reads) and writes into
the snapshot directory:

- `weights.delta` (common/weights/delta.py): version v on the last version written before it (its
  base; with superseded versions that may be older than v-1), unless v is an **anchor**;
- `chunks.json` last (common/weights/chunk_manifest.py, through a rename): per-chunk BLAKE3 digests
  of `model.safetensors` and of the delta, and the delta's base and hash. Until it exists the
  consumer tells network fetchers to wait a moment (consumer/snapshots/fanout.py).

Anchors: the first version written, every version at least `anchor_every` after the previous
anchor, any version whose layout differs from its base's, and any version whose delta would
exceed `max_ratio` of the full file (then the delta is not written: it would not be much smaller).

Every version keeps its full `model.safetensors` on the consumer's disk (loaders, evaluation,
resume and same-host producers read it as before), so a delta's base only matters to a producer:
one that holds exactly the base takes the delta; any other takes the full file of the newest
version (never more bytes than an anchor plus the deltas after it). Nothing on the consumer's
disk depends on an older snapshot, so keep-last rotation and resume need no extra care. These
files are not fsynced: after a crash the resumed consumer publishes its version anew.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.config import Config
from common.weights import chunk_manifest as cm
from common.weights import delta as D
from common.weights import snapshot as snap

log = logging.getLogger("asyncgrpo.consumer")


@dataclass(frozen=True, slots=True)
class DeltaRecord:
    """The delta written next to a snapshot: base version and file hash, size."""

    base_version: int
    hash: str
    num_bytes: int
    elements_changed: int


class FetchFiles:
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

    def prepare(self, directory: Path, *, version: int, file_hash: str) -> DeltaRecord | None:
        """Write `weights.delta` (unless `version` is an anchor), then `chunks.json`, into the
        published snapshot `directory`; returns the delta written, if any."""
        t0 = time.perf_counter()
        weights = directory / snap.WEIGHTS_FILE
        data = np.memmap(weights, dtype=np.uint8, mode="r")
        try:
            files = {"weights": cm.chunk_hashes(data.data, self.chunk_bytes)}
            record = self._delta(directory, data, version, file_hash)
            self.full_bytes += len(data)
        finally:
            del data
        chunks = cm.Chunks(files)
        if record is not None:
            delta_data = (directory / D.DELTA_FILE).read_bytes()
            files["delta"] = cm.chunk_hashes(delta_data, self.chunk_bytes)
            chunks = cm.Chunks(files, record.base_version, record.hash)
            self.num_deltas += 1
            self.delta_bytes += record.num_bytes
        else:
            self.num_anchors += 1
            self._last_anchor = version
        cm.write_chunks(directory, chunks)
        self._last = (version, weights, file_hash)
        self.last_delta_s = time.perf_counter() - t0
        return record

    def _delta(
        self, directory: Path, new: np.ndarray, version: int, file_hash: str
    ) -> DeltaRecord | None:
        last = self._last
        if (
            self.anchor_every <= 0
            or last is None
            or version - self._last_anchor >= self.anchor_every
        ):
            return None
        base_version, base_path, base_hash = last
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
        tmp = directory / (D.DELTA_FILE + ".tmp")
        tmp.unlink(missing_ok=True)
        digest = D.write_delta(tmp, header, arrays)
        os.replace(tmp, directory / D.DELTA_FILE)
        changed = sum(len(p.values) for p in patches)
        return DeltaRecord(base_version, digest, size, changed)


def snapshot_chunk_bytes(cfg: Config) -> int:
    """The chunk size of fetches over the network: `snapshot.chunk_mib`, and small enough for
    one chunk reply to fit a message (`net.max_message_mib`, with room for the envelope)."""
    mib = 1 << 20
    return max(1, min(int(cfg.snapshot.chunk_mib * mib), int(cfg.net.max_message_mib * mib) - 4096))
