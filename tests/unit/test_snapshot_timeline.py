"""Which snapshot is a run's result: a resumed run drops the interrupted timeline's newer
versions, and `final.json` (not the highest number on disk) names the version a run ended with."""

from __future__ import annotations

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


def test_final_json_names_the_version_a_run_ended_with(tmp_path):
    assert snap.final_version(tmp_path) is None  # never ended
    snap.write_final(tmp_path, 596)
    assert snap.final_version(tmp_path) == 596
    assert not (tmp_path / "final.json.tmp").exists()
    (tmp_path / RF.FINAL).write_text("{not json")
    assert snap.final_version(tmp_path) is None
