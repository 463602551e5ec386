"""Every hint the CLI prints names an option that exists on the command that prints it, and every
command it quotes parses (the checks: tests/hints_check.py); then each check is shown to find
what it is for."""

from __future__ import annotations

import pytest
from hints_check import hint_problems, product_hints
from typer.testing import CliRunner

from common.files import run_files as RF
from launch.cli import app

HINTS = product_hints()


def test_there_are_hints_to_check() -> None:
    assert len(HINTS) > 40
    assert any(where.startswith("launch/run_dir.py") for where, _ in HINTS)


@pytest.mark.parametrize(("where", "text"), HINTS, ids=[f"{w} {t}"[:100] for w, t in HINTS])
def test_every_hint_names_options_of_the_commands_that_show_it(where: str, text: str) -> None:
    assert not hint_problems(where.rsplit(":", 1)[0], text)


@pytest.mark.parametrize("command", ["launch", "consumer"])
def test_a_run_directory_refused_names_options_the_command_takes(tmp_path, command) -> None:
    """The hint of a run directory that holds a run, shown by each command that claims one,
    taken at its word: `--resume` there parses (and gets past the refusal)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RF.METRICS).write_text("")
    refused = CliRunner().invoke(app, [command, "--run-dir", str(run_dir)])
    assert refused.exit_code == 2
    assert "pass --resume to continue it, or --force" in refused.output
    for option in ("--resume", "--force"):
        from docs_check import cli_problem

        assert cli_problem([command, "--run-dir", str(run_dir), option]) is None, option


# -- the check finds what it is for ------------------------------------------------------------
def test_an_option_a_command_lacks_or_a_quoted_command_that_fails_to_parse_is_found() -> None:
    assert hint_problems("launch/run_dir.py", "pass --resume to continue it") == []
    assert hint_problems("launch/run_dir.py", "pass --bind 0.0.0.0") == [
        "--bind: not an option of launch"
    ]
    assert hint_problems("common/config/x.py", "or pass --insecure") == [
        "--insecure: not an option of launch"
    ]
    assert hint_problems("producer/x.py", "choose another --id") == []
    assert hint_problems("launch/x.py", "try --no-such-thing") == [
        "--no-such-thing: no command has it"
    ]
    found = hint_problems("producer/x.py", "start it with `asyncgrpo producer --conect H`")
    assert any("No such option: --conect" in p for p in found), found
    assert hint_problems("launch/x.py", "`torchrun --standalone -m launch.cli consumer`") == []
    assert hint_problems("launch/x.py", "--standalone") == []  # an argument, not a hint
