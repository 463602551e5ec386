"""The README opens with the two commands, and they are what CI and a user run.

(The rest of what README.md and docs/ say is checked by tests/unit/test_docs.py, the config
reference in docs/config.md among it.)"""

from __future__ import annotations

from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_opens_with_the_two_commands() -> None:
    head = README[: README.index("## How it works")]
    assert "asyncgrpo launch" in head
    assert "bash .ci/run" in head
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert "-c .ci/lock.txt" in ci  # CI installs the locked stack ...
    assert "pip install -c .ci/lock.txt -e . && asyncgrpo launch" in head  # ... and so does a user
    assert "pytest" in ci
