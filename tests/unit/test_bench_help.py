"""Every benchmark script imports and shows its `--help` (run in this process, one script at a
time), so a benchmark whose imports broke fails CI instead of its next user: bench/real_model.py
once named a class removed a commit before it landed."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(BENCH.glob("*.py"))


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 20


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_imports_and_shows_its_help(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.setattr(sys, "path", [str(BENCH), *sys.path])
    if "__main__" not in script.read_text():  # a helper module (bench/shapes.py): imports alone
        runpy.run_path(str(script))
        return
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out
