"""The generic top-level package names resolve to this repository, not to another install."""

from __future__ import annotations

import importlib
import tomllib
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
    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert {"common", "producer", "consumer", "launch"} <= set(listed)


def test_every_package_directory_is_listed_so_that_a_wheel_holds_it():
    """`packages` is an explicit list: a subpackage missing from it is missing from a wheel
    (an editable install would still find it, so nothing else would notice)."""
    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    roots = ("common", "producer", "consumer", "launch")
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for root in roots
        for init in (REPO / root).rglob("__init__.py")
    }
    assert set(listed) == found
