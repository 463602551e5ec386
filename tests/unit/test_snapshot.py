"""Snapshot directories: atomic finalize, hash verification, listing and pruning."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common import snapshot as snap
from common.errors import SnapshotError

WEIGHTS = bytes(range(256)) * 41  # 10,496 bytes


def manifest_for(version: int, data: bytes = WEIGHTS) -> snap.Manifest:
    return snap.Manifest(version, version, snap.hash_bytes(data), len(data), "bfloat16", 1.0)


def start(root: Path, version: int, data: bytes = WEIGHTS) -> Path:
    """A half-written snapshot under the temporary name the publisher uses."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{snap.snapshot_dir(root, version).name}.tmp-{os.getpid()}"
    tmp.mkdir()
    (tmp / snap.WEIGHTS_FILE).write_bytes(data)
    (tmp / "config.json").write_text("{}")
    return tmp


def publish(root: Path, version: int, data: bytes = WEIGHTS) -> Path:
    final = snap.snapshot_dir(root, version)
    snap.finalize(start(root, version, data), final, manifest_for(version, data))
    return final


# ---------------------------------------------------------------------------------------------
# finalize


def test_finalize_renames_a_complete_directory_into_place(tmp_path):
    final = publish(tmp_path, 3)
    assert final.name == "v000003"
    assert sorted(p.name for p in final.iterdir()) == [
        "config.json",
        snap.MANIFEST_FILE,
        snap.WEIGHTS_FILE,
    ]
    assert snap.read_manifest(final) == manifest_for(3)
    assert [p.name for p in tmp_path.iterdir()] == ["v000003"]  # no temporary left behind


def test_the_final_directory_appears_only_complete(tmp_path, monkeypatch):
    real_replace = os.replace
    seen = []

    def checked_replace(src, dst):
        src, dst = Path(src), Path(dst)
        seen.append((src.name, dst.name))
        assert not dst.exists()
        assert (src / snap.MANIFEST_FILE).exists()
        assert (src / snap.WEIGHTS_FILE).read_bytes() == WEIGHTS
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", checked_replace)
    publish(tmp_path, 1)
    assert seen == [(f"v000001.tmp-{os.getpid()}", "v000001")]


def test_a_crash_before_the_rename_leaves_no_snapshot_and_the_temporary_is_pruned(
    tmp_path, monkeypatch
):
    publish(tmp_path, 1)

    def crash(src, dst):
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        publish(tmp_path, 2)
    monkeypatch.undo()
    assert not snap.snapshot_dir(tmp_path, 2).exists()
    assert snap.list_versions(tmp_path) == [1]
    start(tmp_path, 3)  # a crash even before the manifest was written
    assert snap.list_versions(tmp_path) == [1]
    assert snap.prune(tmp_path, keep_last=5) == []
    assert [p.name for p in tmp_path.iterdir()] == ["v000001"]


def test_finalize_replaces_an_existing_snapshot_of_the_same_version(tmp_path):
    publish(tmp_path, 2, b"old weights")
    final = publish(tmp_path, 2, b"new weights")
    assert (final / snap.WEIGHTS_FILE).read_bytes() == b"new weights"
    assert snap.read_manifest(final).num_bytes == len(b"new weights")
    assert snap.list_versions(tmp_path) == [2]


# ---------------------------------------------------------------------------------------------
# Verification


def test_a_published_snapshot_verifies(tmp_path):
    final = publish(tmp_path, 1)
    m = snap.read_manifest(final)
    snap.verify_file(final / snap.WEIGHTS_FILE, expected_hash=m.hash, expected_bytes=m.num_bytes)
    snap.verify_bytes(WEIGHTS, expected_hash=m.hash, expected_bytes=m.num_bytes)
    snap.verify_bytes(memoryview(WEIGHTS), expected_hash=m.hash, expected_bytes=m.num_bytes)


@pytest.mark.parametrize("position", [0, 1234, len(WEIGHTS) - 1])
def test_a_flipped_byte_fails_verification(tmp_path, position):
    m = manifest_for(1)
    corrupt = bytearray(WEIGHTS)
    corrupt[position] ^= 0x01
    with pytest.raises(SnapshotError, match="hash"):
        snap.verify_bytes(bytes(corrupt), expected_hash=m.hash, expected_bytes=m.num_bytes)
    path = tmp_path / snap.WEIGHTS_FILE
    path.write_bytes(corrupt)
    with pytest.raises(SnapshotError, match="hash"):
        snap.verify_file(path, expected_hash=m.hash, expected_bytes=m.num_bytes)


def test_a_truncated_snapshot_fails_verification(tmp_path):
    m = manifest_for(1)
    with pytest.raises(SnapshotError, match="bytes"):
        snap.verify_bytes(WEIGHTS[:-1], expected_hash=m.hash, expected_bytes=m.num_bytes)
    path = tmp_path / snap.WEIGHTS_FILE
    path.write_bytes(WEIGHTS[:100])
    with pytest.raises(SnapshotError, match="100 bytes"):
        snap.verify_file(path, expected_hash=m.hash, expected_bytes=m.num_bytes)


def test_a_missing_snapshot_file_fails_verification(tmp_path):
    with pytest.raises(SnapshotError, match="cannot read"):
        snap.verify_file(tmp_path / "nope", expected_hash="00", expected_bytes=1)


def test_hashing_a_file_in_blocks_equals_hashing_its_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(snap, "_HASH_BLOCK", 1000)  # many blocks, the last one partial
    path = tmp_path / "w"
    path.write_bytes(WEIGHTS)
    assert snap.hash_file(path) == snap.hash_bytes(WEIGHTS)
    assert len(snap.hash_bytes(WEIGHTS)) == 64  # BLAKE3, 256-bit hex


def test_an_unreadable_manifest_is_a_snapshot_error(tmp_path):
    with pytest.raises(SnapshotError, match="unreadable manifest"):
        snap.read_manifest(tmp_path)
    (tmp_path / snap.MANIFEST_FILE).write_text("{not json")
    with pytest.raises(SnapshotError, match="unreadable manifest"):
        snap.read_manifest(tmp_path)
    (tmp_path / snap.MANIFEST_FILE).write_text('{"version": 1}')
    with pytest.raises(SnapshotError, match="unreadable manifest"):
        snap.read_manifest(tmp_path)


# ---------------------------------------------------------------------------------------------
# Listing and pruning


def test_list_versions_sees_only_complete_snapshots(tmp_path):
    root = tmp_path / "snapshots"
    assert snap.list_versions(root) == []  # no directory yet
    for v in (10, 2, 7):
        publish(root, v)
    start(root, 11)  # being written
    (root / "v000012").mkdir()  # no manifest: never finalized
    (root / "notes").mkdir()
    (root / "v000013").write_text("a file, not a snapshot")
    (root / "vlatest").mkdir()
    assert snap.list_versions(root) == [2, 7, 10]


def test_prune_keeps_the_newest_and_the_protected(tmp_path):
    for v in range(1, 7):
        publish(tmp_path, v)
    removed = snap.prune(tmp_path, keep_last=2, protect=(1, 3))
    assert removed == [2, 4]
    assert snap.list_versions(tmp_path) == [1, 3, 5, 6]
    assert not snap.snapshot_dir(tmp_path, 2).exists()


def test_prune_with_no_more_snapshots_than_kept_removes_nothing(tmp_path):
    for v in range(3):
        publish(tmp_path, v)
    assert snap.prune(tmp_path, keep_last=3) == []
    assert snap.prune(tmp_path, keep_last=10) == []
    assert snap.list_versions(tmp_path) == [0, 1, 2]


def test_prune_keeping_none_removes_every_unprotected_snapshot(tmp_path):
    for v in range(3):
        publish(tmp_path, v)
    assert snap.prune(tmp_path, keep_last=0, protect=(1,)) == [0, 2]
    assert snap.list_versions(tmp_path) == [1]


def test_prune_of_a_missing_root_does_nothing(tmp_path):
    assert snap.prune(tmp_path / "nope", keep_last=1) == []
