"""The bytes of a recorded stream: numbered segment files of hashed records (no threads).

Layout: `RUN/stream/000000.seg`, `000001.seg`, ... Each segment starts with a 16-byte header

    b"AGSTREAM" | u16 format (FORMAT) | u16 wire schema (common.wire.SCHEMA_VERSION) | u32 index

then holds records, each

    u8 kind | u32 payload length | payload | 16-byte BLAKE3 of (kind, length, payload)

(integers little-endian). Kinds: `GROUP` (a `common.wire.Group` as its wire bytes), `STEP`
and `SNAPSHOT` (UTF-8 JSON, consumer/stream/records.py). 21 bytes of framing per record. A
finished segment ends with a `SEAL` record whose payload is the 32-byte BLAKE3 of every byte
before it: the whole segment's hash.

Invariants:
- A segment is only ever appended to; a new one starts when the current one passes
  `max_bytes` or a writer is opened again (a resumed run), so a finished segment never changes.
- Every record carries its own hash: a reader trusts nothing it has not checked, and names the
  file and offset of the first record that fails.
- A segment is sealed when it is finished (rolled, closed, or found unsealed by the next
  writer, after `repair`), so only the newest one can be unsealed, and a sealed segment whose
  hash fails is corrupt, however its records look.
- A torn tail (a kill mid-write: a partial header, a record running past the end of the file,
  or a last record whose hash fails) exists only at the end of the newest, unsealed segment;
  `repair` cuts it back to the last whole record. Anything else wrong is corruption (an
  unknown record kind included: a torn write leaves a prefix of a record), never repaired.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import blake3

from common.errors import StreamError
from common.files.disk import writing

MAGIC = b"AGSTREAM"
FORMAT = 1
HEADER = struct.Struct("<8sHHI")
FRAME = struct.Struct("<BI")
DIGEST_BYTES = 16
GROUP, STEP, SNAPSHOT, SEAL = 1, 2, 3, 4
KINDS = (GROUP, STEP, SNAPSHOT)  # the records a segment's body holds
SEAL_BYTES = FRAME.size + 32 + DIGEST_BYTES
SUFFIX = ".seg"


def segment_name(index: int) -> str:
    return f"{index:06d}{SUFFIX}"


def segments(directory: Path) -> list[Path]:
    """The segment files of `directory`, oldest first (none when it does not exist)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix == SUFFIX and p.stem.isdigit())


def _digest(kind: int, payload: bytes | memoryview) -> bytes:
    h = blake3.blake3(FRAME.pack(kind, len(payload)))
    h.update(payload)
    return h.digest(DIGEST_BYTES)


def frame(kind: int, payload: bytes) -> bytes:
    """One record's bytes."""
    assert kind in (*KINDS, SEAL), kind
    return FRAME.pack(kind, len(payload)) + payload + _digest(kind, payload)


@dataclass(frozen=True, slots=True)
class Record:
    kind: int
    payload: bytes
    path: Path
    offset: int  # of the record's first byte in its segment


@dataclass(frozen=True, slots=True)
class Scan:
    """What reading a segment found: its whole records' end, and why it stopped before the
    file's end (None: it did not)."""

    end: int
    size: int
    torn: str | None


def check_header(path: Path, data: bytes, schema: int) -> None:
    """Refuse a segment of another format or wire schema (StreamError naming the file)."""
    if len(data) < HEADER.size:
        raise StreamError(f"{path}: truncated segment header ({len(data)} bytes)")
    magic, fmt, wire_schema, _index = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise StreamError(f"{path}: not a stream segment (bad magic)")
    if fmt != FORMAT:
        raise StreamError(f"{path}: stream format {fmt}, this build reads {FORMAT}")
    if wire_schema != schema:
        raise StreamError(
            f"{path}: recorded with wire schema {wire_schema}, this build speaks {schema}: "
            "replay it with the release that recorded it"
        )


def _walk(path: Path, data: bytes) -> Iterator[tuple[Record | None, int, str | None]]:
    """(record, its end, None) for each whole record; then at most one (None, end, why) where
    the bytes stop making records."""
    pos = HEADER.size
    while pos < len(data):
        if len(data) - pos < FRAME.size:
            yield None, pos, "partial record header"
            return
        kind, n = FRAME.unpack_from(data, pos)
        end = pos + FRAME.size + n + DIGEST_BYTES
        if kind not in KINDS:
            what = "a seal whose hash fails" if kind == SEAL else f"unknown record kind {kind}"
            yield None, pos, what
            return
        if end > len(data):
            yield None, pos, f"record of {n} bytes runs past the end of the file"
            return
        payload = data[pos + FRAME.size : end - DIGEST_BYTES]
        if _digest(kind, payload) != data[end - DIGEST_BYTES : end]:
            yield None, pos, "record hash does not match"
            return
        yield Record(kind, payload, path, pos), end, None
        pos = end


def _seal(data: bytes) -> str:
    """ "none" (no seal at the end), "ok" (sealed, the hash holds) or "bad" (it does not)."""
    if len(data) < HEADER.size + SEAL_BYTES:
        return "none"
    at = len(data) - SEAL_BYTES
    kind, n = FRAME.unpack_from(data, at)
    payload = data[at + FRAME.size : len(data) - DIGEST_BYTES]
    if kind != SEAL or n != 32 or _digest(SEAL, payload) != data[-DIGEST_BYTES:]:
        return "none"
    return "ok" if blake3.blake3(data[:at]).digest() == payload else "bad"


def _body(path: Path, data: bytes) -> tuple[bytes, bool]:
    """(the bytes before the seal, True) for a sealed segment whose hash holds; (data, False)
    for an unsealed one; StreamError for a sealed one whose hash fails."""
    state = _seal(data)
    if state == "bad":
        raise StreamError(f"{path}: corrupt: the segment's hash does not match its seal")
    return (data[:-SEAL_BYTES], True) if state == "ok" else (data, False)


def _torn(data: bytes, stop: int, why: str) -> bool:
    """Whether a failure at `stop` of an unsealed segment is what a kill mid-write leaves."""
    if why == "record hash does not match":  # written out of order before a power loss
        n = int(FRAME.unpack_from(data, stop)[1])
        return stop + FRAME.size + n + DIGEST_BYTES == len(data)
    return why == "partial record header" or why.endswith("runs past the end of the file")


def scan(path: Path, schema: int) -> Scan:
    """How far `path` holds whole records (the header and any seal checked)."""
    data = path.read_bytes()
    check_header(path, data, schema)
    body, _sealed = _body(path, data)
    end, torn = HEADER.size, None
    for record, stop, why in _walk(path, body):
        end, torn = (stop, why) if record is None else (stop, None)
    return Scan(end=end, size=len(data), torn=torn)


def read(path: Path, schema: int, *, tail: bool) -> Iterator[Record]:
    """The records of `path`. A record that fails raises StreamError naming the file and its
    offset, unless `tail` (the newest segment), unsealed, and the failure is a torn tail: then
    reading stops there."""
    data = path.read_bytes()
    check_header(path, data, schema)
    state = _seal(data)
    body = data[:-SEAL_BYTES] if state != "none" else data
    for record, stop, why in _walk(path, body):
        if record is not None:
            yield record
            continue
        assert why is not None
        if tail and state == "none" and _torn(body, stop, why):
            return  # a kill mid-write: the records before it are whole
        raise StreamError(f"{path}: corrupt at byte {stop}: {why}")
    if state == "bad":  # every record whole: the damage is in the seal itself
        raise StreamError(f"{path}: corrupt: the segment's hash does not match its seal")


def sealed(path: Path) -> bool:
    """Whether `path` ends with a seal whose hash holds (StreamError if it does not)."""
    return _body(path, path.read_bytes())[1]


def repair(path: Path, schema: int) -> int:
    """Cut a torn tail off `path` (the newest segment); returns the bytes removed. Corruption
    anywhere else raises StreamError instead."""
    data = path.read_bytes()
    check_header(path, data, schema)
    if _body(path, data)[1]:
        return 0
    for record, stop, why in _walk(path, data):
        if record is None:
            assert why is not None
            if not _torn(data, stop, why):
                raise StreamError(f"{path}: corrupt at byte {stop}: {why}")
            with open(path, "r+b") as f:
                f.truncate(stop)
                f.flush()
                os.fsync(f.fileno())
            return len(data) - stop
    return 0


def seal(path: Path) -> None:
    """Append the seal (the hash of everything before it) to an unsealed, whole segment."""
    digest = blake3.blake3(path.read_bytes()).digest()
    with open(path, "ab") as f:
        f.write(frame(SEAL, digest))
        f.flush()
        os.fsync(f.fileno())


class SegmentWriter:
    """Appends records to `directory`'s segments (one thread uses it: the recorder's)."""

    def __init__(self, directory: Path, *, schema: int, max_bytes: int = 64 << 20) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.schema, self.max_bytes = directory, schema, max_bytes
        existing = segments(directory)
        for path in existing[-1:]:  # a killed or resumed run's: whole, then sealed
            repair(path, schema)
            if not sealed(path):
                seal(path)
        self.index = int(existing[-1].stem) + 1 if existing else 0
        self._file: BinaryIO | None = None
        self.bytes_written = 0  # records' bytes, headers excluded, by this writer

    @property
    def path(self) -> Path:
        return self.directory / segment_name(self.index)

    def _open(self) -> BinaryIO:
        if self._file is None:
            self._file = open(self.path, "xb")  # noqa: SIM115 (closed by roll/close)
            header = HEADER.pack(MAGIC, FORMAT, self.schema, self.index)
            self._file.write(header)
            self._size = HEADER.size
            self._hasher = blake3.blake3(header)
        return self._file

    def append(self, kind: int, payload: bytes) -> None:
        data = frame(kind, payload)
        with writing(self.path):
            self._open().write(data)
        self._hasher.update(data)
        self._size += len(data)
        self.bytes_written += len(data)
        if self._size >= self.max_bytes:
            self.roll()

    def position(self) -> tuple[str, int]:
        """(segment path relative to the run directory's parent of `directory`, bytes): where
        the stream ends now, everything before it flushed."""
        with writing(self.path):
            self._open().flush()
        return f"{self.directory.name}/{self.path.name}", self._size

    def sync(self) -> None:
        if self._file is not None:
            with writing(self.path):
                self._file.flush()
                os.fsync(self._file.fileno())

    def flush(self) -> None:
        if self._file is not None:
            with writing(self.path):
                self._file.flush()

    def roll(self) -> None:
        """Finish (seal) the current segment; the next record starts a new one."""
        if self._file is not None:
            with writing(self.path):
                self._file.write(frame(SEAL, self._hasher.digest()))
            self.sync()
            self._file.close()
            self._file = None
            self.index += 1

    def close(self) -> None:
        self.roll()


def cut_after(directory: Path, name: str, size: int) -> list[str]:
    """Resume: the stream as it was at a checkpoint whose position was (`name`, `size`): that
    segment truncated to `size`, later ones removed; returns the removed names."""
    gone = []
    for path in segments(directory):
        if path.name > name:
            path.unlink()
            gone.append(path.name)
        elif path.name == name and path.stat().st_size > size:
            with open(path, "r+b") as f:
                f.truncate(size)
    return gone
