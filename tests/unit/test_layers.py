"""The layers point one way: launch -> consumer | producer -> common, and inside the consumer
learner -> server | train -> snapshots -> key_gate, with server/ and train/ independent
(pyproject's import-linter contracts, imports inside functions included). Run by hand with
`lint-imports`."""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]


def test_layers_point_one_way_and_the_two_sides_never_import_each_other(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    assert code == 0, capsys.readouterr().out
