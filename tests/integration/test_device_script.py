"""`.ci/device`, the one script a lent GPU machine runs (docs/sampling.md, docs/development.md):
on this machine every `gpu` test skips, and the script still writes what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[2]


def test_the_device_script_runs_the_gpu_tests_and_writes_its_reports(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "GPU_TESTS_S": "240"}
    done = subprocess.run(
        ["bash", ".ci/device", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu tests exit 0" in done.stdout
    assert (out / "versions.txt").read_text().startswith("torch ")
    suite = ElementTree.parse(out / "gpu-tests.xml").getroot().find("testsuite")
    assert suite is not None
    assert int(suite.get("tests", "0")) >= 10  # the gpu tests were collected, not missed
    assert int(suite.get("failures", "1")) == 0
