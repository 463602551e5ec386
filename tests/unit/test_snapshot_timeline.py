"""Which snapshot is a run's result: a resumed run drops the interrupted timeline's newer
versions, and `final.json` (not the highest number on disk) names the version a run ended with."""

from __future__ import annotations

import os

from common.files import run_files as RF
from common.weights import snapshot as snap


def _publish(root, version: int) -> None:
    d = snap.snapshot_dir(root, version)
    d.mkdir(parents=True)
    (d / snap.MANIFEST_FILE).write_text("{}")


def test_resume_removes_exactly_the_snapshots_above_the_checkpoint(tmp_path):
    root = tmp_path / "snapshots"
    for v in (8, 9, 10, 11, 12):
        _publish(root, v)
    (root / "v000013.tmp-abc").mkdir()  # a publication the kill interrupted
    assert snap.remove_newer(root, 10) == [11, 12]
    assert snap.list_versions(root) == [8, 9, 10]
    assert sorted(p.name for p in root.iterdir()) == ["v000008", "v000009", "v000010"]
    assert snap.remove_newer(tmp_path / "none", 3) == []


def test_a_newer_snapshot_that_cannot_be_deleted_still_leaves_the_timeline(tmp_path, monkeypatch):
    root = tmp_path / "snapshots"
    for v in (9, 10, 11, 12):
        _publish(root, v)
    (snap.snapshot_dir(root, 11) / "model.safetensors").write_bytes(b"x")
    (root / "v000013.tmp-abc").mkdir()
    (root / "v000013.tmp-abc" / "model.safetensors").write_bytes(b"x")
    unlink = os.unlink

    def stuck(path, *args, **kwargs):  # the weights files cannot be deleted (EIO, EBUSY, ...)
        if str(path).endswith("model.safetensors"):
            raise PermissionError(1, "cannot delete", str(path))
        unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", stuck)
    assert snap.remove_newer(root, 10) == [11, 12]  # goes on: the resume is not stopped
    assert snap.list_versions(root) == [9, 10]  # v11 no longer shadows the new timeline's
    left = sorted(p.name for p in root.iterdir())
    assert left[:2] == ["v000009", "v000010"]
    assert left[2].startswith("v000011.tmp-")  # what could not be deleted: a temporary name
    assert left[3:] == ["v000013.tmp-abc"]
    monkeypatch.setattr(os, "unlink", unlink)
    assert snap.remove_newer(root, 10) == []  # the next resume deletes the leftovers
    assert sorted(p.name for p in root.iterdir()) == ["v000009", "v000010"]


def test_final_json_names_the_version_a_run_ended_with(tmp_path):
    assert snap.final_version(tmp_path) is None  # never ended
    snap.write_final(tmp_path, 596)
    assert snap.final_version(tmp_path) == 596
    assert not (tmp_path / "final.json.tmp").exists()
    (tmp_path / RF.FINAL).write_text("{not json")
    assert snap.final_version(tmp_path) is None
