"""The generic top-level package names resolve to this repository, not to another install."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["common", "producer", "consumer", "launch"])
def test_top_level_package_comes_from_this_repository(name):
    module = importlib.import_module(name)
    assert module.__file__ is not None, f"{name} is a namespace package, not ours"
    assert Path(module.__file__).resolve().parent == REPO / name


def test_the_repository_root_is_the_one_holding_pyproject():
    assert (REPO / "pyproject.toml").is_file()
    assert (
        'packages = ["common", "producer", "consumer", "launch"]'
        in (REPO / "pyproject.toml").read_text()
    )
