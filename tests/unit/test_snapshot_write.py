"""Writing a snapshot file from memory while hashing it, and who may trust a manifest's hash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common import snapshot as snap

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
