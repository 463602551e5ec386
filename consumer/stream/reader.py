"""Reads a recorded stream back (RUN/stream/, consumer/stream/segments.py): every record checked
before a replay trains anything, into the steps to replay and the snapshot hashes to compare.

`index(stream_dir)` walks every segment once (BLAKE3 per record) and returns a `Recording`: per
step its entry and where each of its groups' wire bytes lie; `load_group` reads one back.
What is wrong is a `StreamError` naming the file and the step it stops (a missing segment, a
truncated or corrupt one, another format or wire schema, steps out of order, a step whose group
the stream does not hold). A torn tail of the newest segment (the run was killed) is not an
error: the steps recorded whole before it are the recording, and `Recording.torn` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from common import wire
from common.errors import StreamError, WireError
from consumer.stream import segments as S
from consumer.stream.records import SnapshotEntry, StepEntry


@dataclass(frozen=True, slots=True)
class GroupAt:
    """Where a group's wire bytes lie."""

    path: Path
    offset: int  # of the payload
    length: int


@dataclass(frozen=True, slots=True)
class Step:
    entry: StepEntry
    path: Path  # the segment holding the step's record
    groups: tuple[GroupAt, ...]  # the trained groups, in the order they were trained


@dataclass
class Recording:
    steps: list[Step] = field(default_factory=list)
    snapshots: dict[int, str] = field(default_factory=dict)  # version -> BLAKE3 hex (the last)
    torn: str | None = None  # where the newest segment stops short, if it does
    record_bytes: int = 0  # every record's bytes (framing included)
    group_bytes: int = 0  # the groups' wire bytes
    tokens: int = 0  # completion tokens of the trained groups (their `num_tokens`)


def index(directory: Path, *, schema: int = wire.SCHEMA_VERSION) -> Recording:
    """Check and index every record of the stream in `directory` (module doc)."""
    paths = S.segments(directory)
    if not paths:
        raise StreamError(
            f"{directory}: no recorded stream (run.record_stream was off, or the run predates it)"
        )
    out, groups = Recording(), dict[int, GroupAt]()
    for expected, path in enumerate(paths):
        if int(path.stem) != expected:
            raise StreamError(
                f"{directory / S.segment_name(expected)} is missing: the stream stops after "
                f"step {len(out.steps)}"
            )
        tail = path == paths[-1]
        try:
            for record in S.read(path, schema, tail=tail):
                out.record_bytes += S.FRAME.size + len(record.payload) + S.DIGEST_BYTES
                _take(record, out, groups)
        except StreamError as exc:
            raise StreamError(f"{exc} (step {_next_version(out)})") from None
        if tail:
            found = S.scan(path, schema)
            if found.torn:
                out.torn = f"{path}: {found.torn} at byte {found.end} (a torn tail, ignored)"
    return out


def _next_version(out: Recording) -> int:
    return out.steps[-1].entry.version + 1 if out.steps else 0


def _take(record: S.Record, out: Recording, groups: dict[int, GroupAt]) -> None:
    payload = record.payload
    if record.kind == S.GROUP:
        lease_id = _lease_id(record)
        groups[lease_id] = GroupAt(record.path, record.offset + S.FRAME.size, len(payload))
        out.group_bytes += len(payload)
        return
    try:
        parsed = (StepEntry if record.kind == S.STEP else SnapshotEntry).from_bytes(payload)
    except (ValueError, KeyError, TypeError) as exc:
        where = f"{record.path}: unreadable entry at byte {record.offset}"
        raise StreamError(f"{where}: {exc}") from None
    if isinstance(parsed, SnapshotEntry):
        out.snapshots[parsed.version] = parsed.hash
        return
    want = _next_version(out)
    if out.steps and parsed.version != want:
        raise StreamError(
            f"{record.path}: step {parsed.version} follows step {want - 1} at byte {record.offset}"
        )
    missing = [i for i in parsed.kept if i not in groups]
    if missing:
        raise StreamError(
            f"{record.path}: step {parsed.version} trains group(s) {missing} that the stream "
            "does not hold"
        )
    kept = tuple(groups.pop(i) for i in parsed.kept)
    for lease_id, _why in parsed.dropped:
        groups.pop(lease_id, None)
    out.steps.append(Step(parsed, record.path, kept))
    out.tokens += parsed.tokens


def _lease_id(record: S.Record) -> int:
    """The lease id of a group record, read without checking it against a run."""
    try:
        g = wire.decode(record.payload)
    except WireError as exc:
        raise StreamError(
            f"{record.path}: the group at byte {record.offset} does not decode: {exc}"
        ) from None
    if not isinstance(g, wire.Group):
        raise StreamError(f"{record.path}: a {g.KIND} message at byte {record.offset}")
    return g.lease_id


def load_group(at: GroupAt, limits: wire.Limits, *, step: int) -> wire.Group:
    """One recorded group, checked against the replay's run (`limits`: G, vocab, temperature)."""
    with open(at.path, "rb") as f:
        f.seek(at.offset)
        data = f.read(at.length)
    try:
        g = wire.decode(data, limits)
    except WireError as exc:
        raise StreamError(
            f"{at.path}: step {step}: a recorded group does not fit this config ({exc}): "
            "the replay's config does not match the recording"
        ) from None
    assert isinstance(g, wire.Group)
    return g
