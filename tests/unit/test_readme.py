"""The README's promises that code can check: every config key documented, the two commands."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from launch.cli import app

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_config_table_matches_config_docs() -> None:
    result = CliRunner().invoke(app, ["config", "docs"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| `")]
    assert len(rows) > 50
    missing = [row for row in rows if row not in README]
    assert not missing, "README's config table is out of date; paste `asyncgrpo config docs`:\n" + (
        "\n".join(missing)
    )


def test_readme_opens_with_the_two_commands() -> None:
    head = README[: README.index("## How it works")]
    assert "asyncgrpo launch" in head
    assert "bash .ci/run" in head
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert "-c .ci/lock.txt" in ci  # CI installs the locked stack ...
    assert "pip install -c .ci/lock.txt -e . && asyncgrpo launch" in head  # ... and so does a user
    assert "pytest" in ci
