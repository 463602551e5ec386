"""Per-chunk hashes of a snapshot's files: what lets a fetcher take bytes from anyone.

A file of `num_bytes` is cut into chunks of `chunk_bytes` (the last one shorter); chunk i covers
`[i * chunk_bytes, min((i + 1) * chunk_bytes, num_bytes))` and its BLAKE3 digest (32 raw bytes)
is the i-th entry of `hashes`. The consumer computes them when it publishes (off the training
thread), keeps them in `chunks.json` next to the manifest, and hands them to fetchers over its
authenticated control channel (`wire.FetchPlan`); a fetcher then accepts a chunk from a relay (an
untrusted producer) only if its bytes hash to that entry. The whole-file hash is still checked at
the end: a chunk manifest never replaces it.

Files (`FILES`): `weights` is model.safetensors, `delta` is weights.delta (common/weights/delta.py).
`chunks.json` also names the delta's base version and its file hash (`Chunks`). It is written
last, by replacing a temporary file: a snapshot directory without it is still being prepared.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import blake3

CHUNKS_FILE = "chunks.json"
DIGEST_BYTES = 32
FILES = ("weights", "delta")


@dataclass(frozen=True, slots=True)
class ChunkHashes:
    """The chunk digests of one file (`hashes`: `num_chunks * 32` raw bytes)."""

    num_bytes: int
    chunk_bytes: int
    hashes: bytes

    @property
    def num_chunks(self) -> int:
        return len(self.hashes) // DIGEST_BYTES

    def span(self, index: int) -> tuple[int, int]:
        """Chunk `index` as `(offset, size)`."""
        offset = index * self.chunk_bytes
        return offset, min(self.chunk_bytes, self.num_bytes - offset)

    def matches(self, index: int, data: bytes | memoryview) -> bool:
        """True when `data` is exactly chunk `index` (length and digest)."""
        if not 0 <= index < self.num_chunks or len(data) != self.span(index)[1]:
            return False
        want = self.hashes[index * DIGEST_BYTES : (index + 1) * DIGEST_BYTES]
        return blake3.blake3(data).digest() == want

    def consistent(self) -> bool:
        """The number of digests fits the size and chunk size."""
        expected = -(-self.num_bytes // self.chunk_bytes) if self.chunk_bytes > 0 else -1
        return len(self.hashes) == expected * DIGEST_BYTES and len(self.hashes) % DIGEST_BYTES == 0


def chunk_hashes(data: bytes | memoryview, chunk_bytes: int) -> ChunkHashes:
    """The chunk digests of `data` (one BLAKE3 per chunk, on this thread)."""
    assert chunk_bytes > 0
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    digests = b"".join(
        blake3.blake3(view[o : o + chunk_bytes]).digest() for o in range(0, len(view), chunk_bytes)
    )
    return ChunkHashes(len(view), chunk_bytes, digests)


@dataclass(frozen=True, slots=True)
class Chunks:
    """A snapshot's `chunks.json`: chunk hashes per file, and the delta's base and hash."""

    files: dict[str, ChunkHashes] = field(default_factory=dict)
    delta_base: int = -1  # -1: an anchor (no delta)
    delta_hash: str = ""


def write_chunks(directory: Path, chunks: Chunks) -> None:
    """`directory/chunks.json` (through a temporary file and a rename: all or nothing)."""
    files = {
        name: {"num_bytes": c.num_bytes, "chunk_bytes": c.chunk_bytes, "hashes": c.hashes.hex()}
        for name, c in chunks.files.items()
    }
    record = {"delta_base": chunks.delta_base, "delta_hash": chunks.delta_hash, "files": files}
    tmp = directory / (CHUNKS_FILE + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, directory / CHUNKS_FILE)


def read_chunks(directory: Path) -> Chunks | None:
    """What `write_chunks` wrote; None while the snapshot has no (readable) chunk manifest."""
    try:
        record = json.loads((directory / CHUNKS_FILE).read_text())
        files = {
            name: ChunkHashes(
                int(e["num_bytes"]), int(e["chunk_bytes"]), bytes.fromhex(e["hashes"])
            )
            for name, e in record["files"].items()
            if name in FILES
        }
        return Chunks(files, int(record["delta_base"]), str(record["delta_hash"]))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
