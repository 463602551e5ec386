"""The generic top-level package names resolve to this repository, not to another install."""

from __future__ import annotations

import fnmatch
import importlib
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOP = sorted(["common", "producer", "consumer", "launch"])


@pytest.mark.parametrize("name", ["common", "producer", "consumer", "launch"])
def test_top_level_package_comes_from_this_repository(name):
    module = importlib.import_module(name)
    assert module.__file__ is not None, f"{name} is a namespace package, not ours"
    assert Path(module.__file__).resolve().parent == REPO / name


def test_the_repository_root_is_the_one_holding_pyproject():
    assert (REPO / "pyproject.toml").is_file()


def test_the_four_packages_and_every_subpackage_are_installed_and_nothing_else():
    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = found["packages"]["find"]["include"]
    tops = ("common", "producer", "consumer", "launch")
    assert {p for p in include if "*" not in p} == set(tops)
    packages = {
        ".".join(init.parent.relative_to(REPO).parts)
        for top in tops
        for init in (REPO / top).rglob("__init__.py")
    }
    assert "common.config" in packages
    installed = {p for p in packages if any(fnmatch.fnmatchcase(p, pat) for pat in include)}
    assert installed == packages
    assert not any(fnmatch.fnmatchcase(name, pat) for pat in include for name in ("tests", "bench"))
