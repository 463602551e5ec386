"""Writing a snapshot file from memory while hashing it, and who may trust a manifest's hash."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest

from common.errors import SnapshotError
from common.weights import snapshot as snap

DATA = bytes(range(256)) * 4099  # 1,049,344 bytes


def test_write_file_writes_the_bytes_and_returns_their_hash(tmp_path, monkeypatch):
    monkeypatch.setattr(snap, "_WRITE_BLOCK", 100_000)  # many writes, the last one partial
    path = tmp_path / "w"
    digest = snap.write_file(path, memoryview(DATA))
    assert path.read_bytes() == DATA
    assert digest == snap.hash_bytes(DATA) == snap.hash_file(path)


def test_write_file_never_overwrites_and_closes_its_descriptor_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "w"
    path.write_bytes(b"old")
    with pytest.raises(FileExistsError):
        snap.write_file(path, memoryview(DATA))
    assert path.read_bytes() == b"old"

    closed: list[int] = []
    real_close = os.close

    def failing_write(fd: int, data: memoryview) -> int:
        raise OSError("no space left on device")

    def recording_close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(os, "write", failing_write)
    monkeypatch.setattr(os, "close", recording_close)
    with pytest.raises(OSError, match="no space"):
        snap.write_file(tmp_path / "x", memoryview(DATA))
    assert len(closed) == 1


@pytest.mark.parametrize("fsync", [True, False])
def test_write_file_fsyncs_only_when_asked(tmp_path, monkeypatch, fsync):
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    snap.write_file(tmp_path / "w", memoryview(DATA), fsync=fsync)
    assert len(synced) == int(fsync)


def test_a_manifest_hash_is_trusted_only_on_the_host_that_wrote_it(monkeypatch, tmp_path):
    here = snap.Manifest(1, 1, "ab", 2, "bfloat16", 0.0, snap.host_id())
    assert snap.host_id()  # Linux has a boot id
    assert snap.written_here(here)
    elsewhere = snap.Manifest(1, 1, "ab", 2, "bfloat16", 0.0, "other-host/0000")
    assert not snap.written_here(elsewhere)
    assert not snap.written_here(snap.Manifest(1, 1, "ab", 2, "bfloat16", 0.0))  # unknown writer
    boot = tmp_path / "boot_id"  # the same hostname after a reboot is another page cache
    boot.write_text("another-boot\n")
    monkeypatch.setattr(snap, "_BOOT_ID", boot)
    assert not snap.written_here(here)
    monkeypatch.setattr(snap, "_BOOT_ID", Path(tmp_path / "missing"))
    assert snap.host_id() == ""
    assert not snap.written_here(snap.Manifest(1, 1, "ab", 2, "bfloat16", 0.0, ""))


def test_manifests_without_a_writer_still_read(tmp_path):
    (tmp_path / snap.MANIFEST_FILE).write_text(
        '{"version": 3, "step": 3, "hash": "ab", "num_bytes": 2, "dtype": "bfloat16",'
        ' "created_unix": 1.0}'
    )
    assert snap.read_manifest(tmp_path).writer == ""


def published(tmp_path: Path, *, writer: str) -> tuple[Path, snap.Manifest]:
    directory = tmp_path / "v000001"
    directory.mkdir()
    path = directory / snap.WEIGHTS_FILE
    path.write_bytes(DATA)
    manifest = snap.Manifest(1, 1, snap.hash_bytes(DATA), len(DATA), "bfloat16", 0.0, writer)
    (directory / snap.MANIFEST_FILE).write_text(json.dumps(dataclasses.asdict(manifest)))
    return path, manifest


def test_a_local_file_written_on_this_host_is_taken_on_its_manifest(tmp_path, monkeypatch):
    path, m = published(tmp_path, writer=snap.host_id())
    hashed: list[int] = []
    monkeypatch.setattr(snap, "_hash_fd", lambda fd: hashed.append(fd) or m.hash)
    expect = {"expected_hash": m.hash, "expected_bytes": m.num_bytes}
    pinned, trusted = snap.pin_local(path, tmp_path / "pin", **expect, trust_writer=True)
    assert trusted
    assert hashed == []
    assert pinned.read_bytes() == DATA
    _, trusted = snap.pin_local(path, tmp_path / "pin", **expect, trust_writer=False)
    assert not trusted  # the policy says hash
    assert len(hashed) == 1


@pytest.mark.parametrize(
    "change", ["another host", "announced hash", "announced size", "file size", "no manifest"]
)
def test_a_local_file_is_hashed_unless_everything_matches(tmp_path, change):
    """Each case changes one thing; the file is also corrupted where only hashing can tell."""
    path, m = published(tmp_path, writer="elsewhere/1" if change == "another host" else "")
    if change != "another host":
        (path.parent / snap.MANIFEST_FILE).write_text(
            json.dumps(dataclasses.asdict(dataclasses.replace(m, writer=snap.host_id())))
        )
    expected_hash, expected_bytes = m.hash, m.num_bytes
    if change == "announced hash":
        expected_hash = "0" * 64
    elif change == "announced size":
        expected_bytes += 1
    elif change == "file size":
        path.write_bytes(DATA[:-1])
    elif change == "no manifest":
        (path.parent / snap.MANIFEST_FILE).unlink()
    if change in ("another host", "no manifest"):
        corrupt = bytearray(DATA)
        corrupt[7] ^= 1
        path.write_bytes(bytes(corrupt))
    with pytest.raises(SnapshotError):
        snap.pin_local(
            path, tmp_path / "pin", expected_hash=expected_hash, expected_bytes=expected_bytes,
            trust_writer=True,
        )  # fmt: skip
    assert not (tmp_path / "pin" / snap.WEIGHTS_FILE).exists()


@pytest.mark.parametrize("gone", ["its directory", "its file"])
def test_a_snapshot_rotated_away_before_it_is_pinned_is_named_in_one_line(tmp_path, gone):
    """The producer logs this line when a snapshot vanished (pruned) before it was loaded."""
    path, m = published(tmp_path, writer="")
    if gone == "its directory":
        shutil.rmtree(path.parent)
    else:
        path.unlink()
    expect = {"expected_hash": m.hash, "expected_bytes": m.num_bytes}
    with pytest.raises(SnapshotError, match=f"^cannot read snapshot {re.escape(str(path))}: "):
        snap.pin_local(path, tmp_path / "pin", **expect, trust_writer=True)
    assert not (tmp_path / "pin" / snap.WEIGHTS_FILE).exists()


@pytest.mark.parametrize("order", ["in order", "shuffled", "reversed"])
def test_an_incoming_file_is_written_and_verified_as_chunks_arrive(tmp_path, order):
    chunk = 100_000
    chunks = [(o, DATA[o : o + chunk]) for o in range(0, len(DATA), chunk)]
    if order == "shuffled":
        random.Random(0).shuffle(chunks)
    elif order == "reversed":
        chunks.reverse()
    incoming = snap.IncomingFile(
        tmp_path / "w", expected_hash=snap.hash_bytes(DATA), expected_bytes=len(DATA)
    )
    for offset, data in chunks:
        incoming.add(offset, data)
    assert incoming.hashed == len(DATA)
    assert incoming.finish().read_bytes() == DATA


def test_an_incoming_file_that_disagrees_is_refused_and_removed(tmp_path):
    digest = snap.hash_bytes(DATA)
    incoming = snap.IncomingFile(tmp_path / "w", expected_hash=digest, expected_bytes=len(DATA))
    corrupt = bytearray(DATA)
    corrupt[-1] ^= 1
    incoming.add(0, bytes(corrupt))
    with pytest.raises(SnapshotError, match="hash"):
        incoming.finish()
    assert not (tmp_path / "w").exists()

    short = snap.IncomingFile(tmp_path / "s", expected_hash=digest, expected_bytes=len(DATA))
    short.add(0, DATA[:1000])
    with pytest.raises(SnapshotError, match="1000 bytes"):
        short.finish()
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(("offset", "size"), [(-1, 10), (len(DATA) - 5, 10), (0, 0)])
def test_an_incoming_chunk_outside_the_file_is_refused(tmp_path, offset, size):
    incoming = snap.IncomingFile(
        tmp_path / "w", expected_hash=snap.hash_bytes(DATA), expected_bytes=len(DATA)
    )
    try:
        with pytest.raises(SnapshotError, match="does not fit"):
            incoming.add(offset, b"x" * size)
    finally:
        incoming.close()


def test_write_file_fsyncs_by_default(tmp_path, monkeypatch):
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    snap.write_file(tmp_path / "w", memoryview(DATA))
    assert len(synced) == 1


def test_the_hash_runs_on_its_own_thread_while_the_writer_syncs(tmp_path, monkeypatch):
    import threading

    real_hash, threads = snap.hash_bytes, []

    def recording_hash(data: bytes | memoryview) -> str:
        threads.append(threading.current_thread().name)
        return real_hash(data)

    monkeypatch.setattr(snap, "hash_bytes", recording_hash)
    assert snap.write_file(tmp_path / "w", memoryview(DATA)) == real_hash(DATA)
    assert len(threads) == 1
    assert threads[0].startswith("blake3")  # a named thread, not the caller's


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.usefixtures("umask_022")
def test_snapshot_files_are_rw_r_r_whoever_writes_them(tmp_path):
    snap.write_file(tmp_path / "w", memoryview(DATA))
    incoming = snap.IncomingFile(
        tmp_path / "f", expected_hash=snap.hash_bytes(DATA), expected_bytes=len(DATA)
    )
    incoming.add(0, DATA)
    incoming.finish()
    assert [(tmp_path / n).stat().st_mode & 0o777 for n in ("w", "f")] == [0o644, 0o644]


def test_a_chunk_that_does_not_fit_says_where_it_is_and_what_fits(tmp_path):
    incoming = snap.IncomingFile(tmp_path / "w", expected_hash="00", expected_bytes=100)
    try:
        incoming.add(0, b"x" * 10)
        with pytest.raises(SnapshotError) as info:
            incoming.add(95, b"x" * 10)
        assert (
            str(info.value) == "chunk [95, 105) does not fit a snapshot of 100 bytes (10 received)"
        )
    finally:
        incoming.close()


def test_a_refused_incoming_file_says_both_sizes_and_hashes(tmp_path):
    digest = snap.hash_bytes(DATA)
    incoming = snap.IncomingFile(tmp_path / "w", expected_hash=digest, expected_bytes=len(DATA))
    incoming.add(0, DATA[:1000])
    got = snap.hash_bytes(DATA[:1000])
    with pytest.raises(SnapshotError) as info:
        incoming.finish()
    assert str(info.value) == (
        f"received snapshot: 1000 bytes, hash {got[:12]}… != announced {len(DATA)} bytes, "
        f"{digest[:12]}…"
    )


def test_a_refused_incoming_file_that_someone_removed_is_still_refused_cleanly(tmp_path):
    incoming = snap.IncomingFile(tmp_path / "w", expected_hash="00", expected_bytes=len(DATA))
    incoming.add(0, DATA[:10])
    (tmp_path / "w").unlink()  # an operator's cleanup, a full restart of the producer's cache
    with pytest.raises(SnapshotError, match="received snapshot"):
        incoming.finish()


def test_closing_an_incoming_file_twice_closes_only_its_own_descriptor(tmp_path):
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    incoming = snap.IncomingFile(tmp_path / "w", expected_hash="00", expected_bytes=1)
    assert open_fds() == before + 1
    incoming.close()
    incoming.close()  # a finish after an error, a cleanup path: never another file's descriptor
    assert open_fds() == before
    with pytest.raises(SnapshotError):
        incoming.finish()
    assert open_fds() == before


@pytest.mark.parametrize("content", ["", "\n"])
def test_without_a_boot_id_this_host_has_no_id_and_no_hash_is_trusted(
    tmp_path, monkeypatch, content
):
    boot = tmp_path / "boot_id"
    boot.write_text(content)
    monkeypatch.setattr(snap, "_BOOT_ID", boot)
    assert snap.host_id() == ""
    assert not snap.written_here(snap.Manifest(1, 1, "ab", 2, "bfloat16", 0.0, ""))


def test_an_incoming_file_opened_as_descriptor_zero_is_closed_too(tmp_path):
    """A process started with stdin closed gets descriptor 0 for the first file it opens."""
    saved = os.dup(0)
    os.close(0)
    try:
        incoming = snap.IncomingFile(tmp_path / "w", expected_hash="00", expected_bytes=1)
        assert os.readlink("/proc/self/fd/0") == str(tmp_path / "w")
        incoming.close()
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(0)  # closed
    finally:
        os.dup2(saved, 0)
        os.close(saved)
