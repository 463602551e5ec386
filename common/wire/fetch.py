"""Wire schema, the data path's messages: a producer fetching a snapshot's file (whole weights or
a delta) or one of the model directory's files, chunk by chunk, from the consumer's data socket
or a relay (consumer/server/fanout.py plans it, producer/fetch/ runs it).

Part of the one wire schema: common/wire/messages.py holds the version, the other kinds and the
`Message` union these belong to; common/wire/codec.py writes and reads the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

BAD_SOURCE_REASONS = ("wrong_bytes", "truncated", "stalled", "refused")


@dataclass(frozen=True, slots=True)
class Source:
    """Where a fetcher may take chunks: "" = the consumer's data socket, else a relay's
    endpoint (`tcp://host:port`) and its CurveZMQ public key (z85; "" without keys)."""

    endpoint: str
    server_key: str


@dataclass(frozen=True, slots=True)
class BadSource:
    endpoint: str
    reason: str  # one of BAD_SOURCE_REASONS


@dataclass(frozen=True, slots=True)
class FetchRequest:
    KIND: ClassVar[str] = "fetch_req"
    req: int
    producer_id: str
    version: int
    held_version: int  # the snapshot whose verified file this producer holds (-1: none)
    held_hash: str
    relay: Source | None  # where this producer serves what it holds (None: it does not)


@dataclass(frozen=True, slots=True)
class FetchDone:
    KIND: ClassVar[str] = "fetch_done"
    req: int
    producer_id: str
    version: int
    file: str  # "weights" | "delta"
    ok: bool
    num_bytes: int
    bad_sources: tuple[BadSource, ...]
    serving: bool  # the producer now serves this version from its relay


@dataclass(frozen=True, slots=True)
class FileChunkRequest:
    KIND: ClassVar[str] = "file_chunk_req"
    req: int
    version: int
    file: str  # "weights" | "delta" | "model/NAME" (a file of RunSpec.model_files; version -1)
    offset: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchPlan:
    KIND: ClassVar[str] = "fetch_plan"
    req: int
    version: int
    file: str  # "weights" | "delta"
    base_version: int  # the version a delta applies to (-1 for weights)
    num_bytes: int
    hash: str  # blake3 hex of the file
    result_hash: str  # blake3 hex of the snapshot's weights (== hash for weights)
    chunk_bytes: int
    chunk_hashes: bytes  # 32 raw bytes (BLAKE3) per chunk
    sources: tuple[Source, ...]
    wait_s: float  # > 0: every source is busy; ask again after this long


@dataclass(frozen=True, slots=True)
class ChunkHead:
    """The first frame of a chunk reply; the second frame holds exactly `num_bytes` bytes."""

    KIND: ClassVar[str] = "chunk_head"
    req: int
    version: int
    offset: int
    total_bytes: int  # size of the whole file
    num_bytes: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk reply as its reader sees it (not a message kind: `ChunkHead` + the data frame).
    `data` is whatever buffer the transport gave (a zero-copy view of a received frame)."""

    req: int
    version: int
    offset: int
    total_bytes: int
    data: bytes | memoryview
