"""The recorded stream's bytes: hashed records, torn tails cut back, corruption named with its
file and step, another schema refused (consumer/stream/segments.py, reader.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common import wire
from common.errors import StreamError
from consumer.stream import reader as R
from consumer.stream import segments as S
from consumer.stream.records import StepEntry


def group(lease_id: int, G: int = 2) -> wire.Group:
    return wire.Group(
        lease_id=lease_id,
        producer_id="p0",
        prompt_index=lease_id,
        behavior_version=0,
        prompt_ids=np.array([1, 2], np.int32),
        completion_ids=np.array([3, 4] * G, np.int32),
        completion_lens=np.full(G, 2, np.int32),
        behavior_logp=np.full(2 * G, -0.5, np.float32),
        token_versions=np.zeros(0, np.int32),
        rewards=np.arange(G, dtype=np.float32),
        finish_reasons=("stop",) * G,
        temperature=1.0,
    )


def record_steps(
    directory: Path, steps: int, *, per_step: int = 2, max_bytes: int = 1 << 20, close: bool = True
) -> S.SegmentWriter:
    w = S.SegmentWriter(directory, schema=wire.SCHEMA_VERSION, max_bytes=max_bytes)
    for v in range(steps):
        ids = [v * per_step + i for i in range(per_step)]
        for i in ids:
            w.append(S.GROUP, wire.encode(group(i)))
        w.append(S.STEP, StepEntry(version=v, kept=tuple(ids), tokens=4 * per_step).to_bytes())
    w.close()
    if not close:  # a killed run's newest segment: never sealed
        last = S.segments(directory)[-1]
        with open(last, "r+b") as f:
            f.truncate(last.stat().st_size - S.SEAL_BYTES)
    return w


def test_a_recorded_stream_reads_back_step_by_step(tmp_path: Path) -> None:
    record_steps(tmp_path, 3)
    rec = R.index(tmp_path)
    assert [s.entry.version for s in rec.steps] == [0, 1, 2]
    assert rec.torn is None
    assert rec.tokens == 24
    g = R.load_group(rec.steps[1].groups[1], wire.Limits(group_size=2), step=1)
    assert g.lease_id == 3


def test_segments_roll_at_their_size_and_read_as_one_stream(tmp_path: Path) -> None:
    record_steps(tmp_path, 6, max_bytes=600)
    assert len(S.segments(tmp_path)) > 2
    assert len(R.index(tmp_path).steps) == 6


def test_a_torn_tail_is_ignored_by_the_reader_and_cut_by_the_next_writer(tmp_path: Path) -> None:
    record_steps(tmp_path, 2, close=False)
    (path,) = S.segments(tmp_path)
    whole = path.stat().st_size
    with open(path, "ab") as f:  # a kill mid-write: half a record
        f.write(S.frame(S.GROUP, wire.encode(group(99)))[:30])
    rec = R.index(tmp_path)
    assert len(rec.steps) == 2
    assert rec.torn is not None
    S.SegmentWriter(tmp_path, schema=wire.SCHEMA_VERSION)  # a resumed run opens it again
    assert path.stat().st_size == whole + S.SEAL_BYTES  # cut back, then sealed
    assert S.sealed(path)
    assert len(R.index(tmp_path).steps) == 2


def test_a_torn_last_record_whose_hash_fails_is_cut_back(tmp_path: Path) -> None:
    record_steps(tmp_path, 2, close=False)
    (path,) = S.segments(tmp_path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the last record's digest: written partly before the kill
    path.write_bytes(bytes(data))
    assert S.repair(path, wire.SCHEMA_VERSION) > 0
    assert [s.entry.version for s in R.index(tmp_path).steps] == [0]


def test_a_corrupt_byte_names_the_file_and_the_step(tmp_path: Path) -> None:
    record_steps(tmp_path, 4, max_bytes=600)
    first = S.segments(tmp_path)[0]
    data = bytearray(first.read_bytes())
    data[S.HEADER.size + 10] ^= 0x01
    first.write_bytes(bytes(data))
    with pytest.raises(
        StreamError, match=rf"{first.name}: corrupt at byte \d+: record hash .*\(step 0\)"
    ):
        R.index(tmp_path)
    with pytest.raises(StreamError, match="corrupt"):
        S.repair(first, wire.SCHEMA_VERSION)  # corruption is never "repaired"


def test_a_missing_or_truncated_middle_segment_is_refused(tmp_path: Path) -> None:
    record_steps(tmp_path, 6, max_bytes=600)
    paths = S.segments(tmp_path)
    with open(paths[1], "r+b") as f:
        f.truncate(paths[1].stat().st_size - 5)
    with pytest.raises(StreamError, match=rf"{paths[1].name}: corrupt at byte \d+"):
        R.index(tmp_path)
    paths[1].unlink()
    with pytest.raises(StreamError, match=rf"{paths[1].name} is missing.*after step \d"):
        R.index(tmp_path)


def test_a_stream_of_another_wire_schema_is_refused(tmp_path: Path) -> None:
    record_steps(tmp_path, 1)
    with pytest.raises(StreamError, match=r"wire schema .* this build speaks"):
        R.index(tmp_path, schema=wire.SCHEMA_VERSION + 1)


def test_no_stream_at_all_says_so(tmp_path: Path) -> None:
    with pytest.raises(StreamError, match="no recorded stream"):
        R.index(tmp_path / "stream")


def test_a_group_that_does_not_fit_the_config_names_the_step(tmp_path: Path) -> None:
    record_steps(tmp_path, 1)
    at = R.index(tmp_path).steps[0].groups[0]
    with pytest.raises(StreamError, match="step 0: a recorded group does not fit"):
        R.load_group(at, wire.Limits(group_size=4), step=0)


def test_resume_cuts_the_stream_back_to_the_checkpoint(tmp_path: Path) -> None:
    w = record_steps(tmp_path, 2)
    name = S.segment_name(w.index - 1)
    size = S.segments(tmp_path)[0].stat().st_size
    record_steps(tmp_path, 1)  # a later incarnation's segment, after the checkpoint
    assert S.cut_after(tmp_path, name, size) == [S.segment_name(1)]
    assert len(R.index(tmp_path).steps) == 2


def test_a_damaged_length_in_a_sealed_segment_is_corruption_not_a_torn_tail(tmp_path: Path) -> None:
    record_steps(tmp_path, 2)  # closed: sealed
    (path,) = S.segments(tmp_path)
    data = bytearray(path.read_bytes())
    data[S.HEADER.size + 3] ^= 0x10  # the first record's length: it now runs past the end
    path.write_bytes(bytes(data))
    with pytest.raises(StreamError, match=r"000000\.seg: corrupt at byte \d+: record of \d+"):
        R.index(tmp_path)
    with pytest.raises(StreamError, match="corrupt"):
        S.SegmentWriter(tmp_path, schema=wire.SCHEMA_VERSION)  # never cut back as if torn


def test_an_unknown_record_kind_in_the_newest_segment_is_corruption(tmp_path: Path) -> None:
    record_steps(tmp_path, 2, close=False)
    (path,) = S.segments(tmp_path)
    data = bytearray(path.read_bytes())
    data[S.HEADER.size] = 9
    path.write_bytes(bytes(data))
    with pytest.raises(StreamError, match="unknown record kind 9"):
        R.index(tmp_path)


def test_a_damaged_seal_over_whole_records_is_named(tmp_path: Path) -> None:
    record_steps(tmp_path, 2)
    (path,) = S.segments(tmp_path)
    data = path.read_bytes()
    body, seal = data[: -S.SEAL_BYTES], bytearray(data[-S.SEAL_BYTES :])
    seal[S.FRAME.size] ^= 0x01  # the whole-segment hash, the seal record itself well formed
    path.write_bytes(body + S.frame(S.SEAL, bytes(seal[S.FRAME.size : -S.DIGEST_BYTES])))
    with pytest.raises(StreamError, match=r"000000\.seg: corrupt: the segment's hash .*\(step 2\)"):
        R.index(tmp_path)
