"""Snapshot directories: atomic finalize, hash verification, listing and pruning; what
publication syncs and that it leaks no file descriptor."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

from common.errors import SnapshotError
from common.weights import chunk_manifest as cm
from common.weights import delta as D
from common.weights import snapshot as snap

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


def test_a_hash_mismatch_names_both_hashes_by_their_first_12_digits(tmp_path):
    m = manifest_for(1)
    got = snap.hash_bytes(b"other")
    expected = f"{got[:12]}… != manifest {m.hash[:12]}…"
    with pytest.raises(SnapshotError) as info:
        snap.verify_bytes(b"other", expected_hash=m.hash, expected_bytes=5)
    assert str(info.value) == f"snapshot hash {expected}"
    path = tmp_path / snap.WEIGHTS_FILE
    path.write_bytes(b"other")
    with pytest.raises(SnapshotError) as info:
        snap.verify_file(path, expected_hash=m.hash, expected_bytes=5)
    assert str(info.value) == f"{path}: hash {expected}"


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


def test_a_file_is_hashed_in_bounded_blocks_never_read_whole(tmp_path, monkeypatch):
    """A snapshot of many GB must not be read into memory at once to be verified."""
    sizes: list[int | None] = []

    class Spy:
        def __init__(self, f) -> None:
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.f.close()

        def read(self, n=None):
            sizes.append(n)
            return self.f.read(n)

    real_open = open
    monkeypatch.setattr(snap, "open", lambda *a, **k: Spy(real_open(*a, **k)), raising=False)
    monkeypatch.setattr(snap, "_HASH_BLOCK", 4096)
    path = tmp_path / "w"
    path.write_bytes(WEIGHTS)
    assert snap.hash_file(path) == snap.hash_bytes(WEIGHTS)
    assert sizes == [4096] * 4  # 10,496 bytes: three blocks, then the empty read that ends it


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


def test_versions_of_every_width_are_listed_by_their_number(tmp_path):
    for v in (0, 7, 123456, 1234567):  # six digits, and past them
        publish(tmp_path, v)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "v000000", "v000007", "v123456", "v1234567",
    ]  # fmt: skip
    assert snap.list_versions(tmp_path) == [0, 7, 123456, 1234567]


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
    (root / "vx00014").mkdir()  # a name that is not v + digits, even with a manifest
    (root / "vx00014" / snap.MANIFEST_FILE).write_text("{}")
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


def test_prune_tolerates_a_snapshot_that_vanished_while_it_ran(tmp_path, monkeypatch):
    """Another process (a second learner cleaning up, an operator) removed it first."""
    for v in range(1, 5):
        publish(tmp_path, v)
    listed = snap.list_versions(tmp_path)
    shutil.rmtree(snap.snapshot_dir(tmp_path, 1))  # gone between the listing and the removal
    monkeypatch.setattr(snap, "list_versions", lambda root: listed)
    assert snap.prune(tmp_path, keep_last=2) == [1, 2]
    monkeypatch.undo()
    assert snap.list_versions(tmp_path) == [3, 4]


def test_prune_tolerates_a_temporary_that_vanished_while_it_ran(tmp_path, monkeypatch):
    publish(tmp_path, 1)
    tmp = start(tmp_path, 2)
    real_glob = Path.glob

    def glob_then_vanish(self, pattern):
        found = list(real_glob(self, pattern))
        shutil.rmtree(tmp)  # the writer's own cleanup got there first
        return found

    monkeypatch.setattr(Path, "glob", glob_then_vanish)
    assert snap.prune(tmp_path, keep_last=1) == []
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["v000001"]


# ---------------------------------------------------------------------------------------------
# Publication syncs every file, the temporary directory and the parent, and closes what it opens


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class SyncAudit:
    """Records every fsync (by the path of the descriptor) and rename, in order, in any thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, ...]] = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd: int) -> None:
            self.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            real_fsync(fd)

        def replace(src, dst, **kw) -> None:
            real_replace(src, dst, **kw)
            self.events.append(("replace", str(Path(src).resolve()), str(Path(dst).resolve())))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)

    def assert_published(self, final: Path) -> None:
        """`final` was renamed into place from a temporary whose files and directory were all
        fsynced before the rename, and the parent directory was fsynced after it."""
        final = final.resolve()
        (r,) = [i for i, e in enumerate(self.events) if e[0] == "replace" and e[2] == str(final)]
        tmp = Path(self.events[r][1])
        assert tmp.parent == final.parent
        before = {e[1] for e in self.events[:r] if e[0] == "fsync"}
        after = {e[1] for e in self.events[r + 1 :] if e[0] == "fsync"}
        names = sorted(p.name for p in final.iterdir())
        assert {snap.WEIGHTS_FILE, snap.MANIFEST_FILE} <= set(names)
        # added after the announcement for network fetchers (derived, rewritten at resume)
        for name in set(names) - {cm.CHUNKS_FILE, D.DELTA_FILE}:
            assert str(tmp / name) in before, f"{name} was not synced before the rename"
        assert str(tmp) in before, "the temporary directory was not synced before the rename"
        assert str(final.parent) in after, "the parent directory was not synced after the rename"


def test_finalize_syncs_every_file_the_temporary_directory_and_the_parent(tmp_path, monkeypatch):
    audit = SyncAudit(monkeypatch)
    final = publish(tmp_path, 4)
    audit.assert_published(final)


def test_finalize_leaves_no_file_descriptor_open(tmp_path):
    publish(tmp_path, 0)  # anything opened once for good (imports, caches) is open by now
    before = open_fds()
    for v in range(1, 6):
        publish(tmp_path, v)
        snap.prune(tmp_path, keep_last=2)
        snap.verify_file(
            snap.snapshot_dir(tmp_path, v) / snap.WEIGHTS_FILE,
            expected_hash=manifest_for(v).hash,
            expected_bytes=len(WEIGHTS),
        )
        snap.read_manifest(snap.snapshot_dir(tmp_path, v))
    assert open_fds() == before


def test_fsync_path_closes_its_descriptor_even_when_fsync_fails(tmp_path, monkeypatch):
    def failing(fd: int) -> None:
        raise OSError("EIO")

    (tmp_path / "f").write_bytes(b"x")
    before = open_fds()
    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="EIO"):
        snap.fsync_path(tmp_path / "f")
    assert open_fds() == before


def test_the_publisher_syncs_each_snapshot_and_leaks_no_descriptor(tmp_path, monkeypatch):
    import torch

    from consumer.snapshots.publisher import Publisher

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "tokenizer.json").write_text("{}")
    (base / "model.safetensors").write_bytes(b"not copied")
    published = []
    root = tmp_path / "snapshots"
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    warm = Publisher(root, base, keep_last=2, on_published=published.append)
    warm.submit(state, version=0, step=0)  # first use opens whatever stays open for good
    warm.close()
    before = open_fds()
    audit = SyncAudit(monkeypatch)
    publisher = Publisher(root, base, keep_last=2, on_published=published.append)
    for v in range(1, 5):
        publisher.submit({"w": state["w"] + v}, version=v, step=v)
        publisher.wait()  # else a version may be superseded by the next before it is written
    publisher.close()
    assert open_fds() == before
    assert [i.version for i in published] == [0, 1, 2, 3, 4]
    assert snap.list_versions(root) == [3, 4]
    for v in (3, 4):
        final = snap.snapshot_dir(root, v)
        audit.assert_published(final)
        assert sorted(p.name for p in final.iterdir()) == [
            "chunks.json", "config.json", snap.MANIFEST_FILE, snap.WEIGHTS_FILE,
            "tokenizer.json",
        ]  # fmt: skip


def test_a_verified_link_is_made_only_to_the_file_still_open(tmp_path):
    """common/weights/snapshot.py `_link_same_file`: the open file is linked; a file replaced
    since it was opened is not (nothing is left under the target name)."""
    path, target = tmp_path / "model.safetensors", tmp_path / "pinned"
    path.write_bytes(b"first")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert snap._link_same_file(fd, path, target) is True
        assert os.stat(target).st_ino == os.fstat(fd).st_ino
        target.unlink()
        replacement = tmp_path / "next"
        replacement.write_bytes(b"other")
        replacement.replace(path)  # the writer replaced the file meanwhile
        assert snap._link_same_file(fd, path, target) is False
        assert not target.exists()
    finally:
        os.close(fd)


def test_an_incoming_file_refuses_writes_after_it_was_closed(tmp_path):
    incoming = snap.IncomingFile(tmp_path / "part", expected_hash="0" * 64, expected_bytes=8)
    incoming.write(0, b"abcd")
    incoming.close()
    with pytest.raises(SnapshotError, match="written after it was closed"):
        incoming.write(4, b"efgh")


def test_an_incoming_file_refuses_a_chunk_given_twice_whether_hashed_or_waiting(tmp_path):
    incoming = snap.IncomingFile(tmp_path / "part", expected_hash="0" * 64, expected_bytes=12)
    incoming.add(0, b"abcd")
    with pytest.raises(SnapshotError, match="chunk at 0 given twice"):
        incoming.follow(0, b"abcd")  # already hashed
    incoming.add(8, b"ijkl")  # early: waits for the gap
    with pytest.raises(SnapshotError, match="chunk at 8 given twice"):
        incoming.follow(8, b"ijkl")
    incoming.add(4, b"efgh")
    assert incoming.hashed == 12
    incoming.close()


def test_a_manifest_is_read_within_64_kib_and_a_longer_one_vouches_for_nothing(tmp_path):
    """The manifest that lets a producer take the writer's hash is read with a bound: one past
    it (padded to look whole only when read whole) is not trusted."""
    manifest = snap.Manifest(3, 3, "ab" * 32, 10, "bfloat16", 0.0, snap.host_id())
    text = json.dumps(dataclasses.asdict(manifest))
    for padding, trusted in ((0, True), (1 << 16, False)):
        (tmp_path / snap.MANIFEST_FILE).write_text(" " * padding + text)
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert snap._vouched(fd, "ab" * 32, 10) is trusted
        finally:
            os.close(fd)


def test_a_copy_across_filesystems_holds_and_hashes_exactly_the_files_bytes(tmp_path):
    """pin_local's copy when a hard link cannot be made: the bytes written are the ones hashed."""
    data = os.urandom(3 << 20)  # several hash blocks
    (tmp_path / "src").write_bytes(data)
    fd = os.open(tmp_path / "src", os.O_RDONLY)
    try:
        digest = snap._copy_hashing(fd, tmp_path / "copy")
    finally:
        os.close(fd)
    assert (tmp_path / "copy").read_bytes() == data
    assert digest == snap.hash_bytes(data)
