"""The generic top-level package names resolve to this repository, not to another install."""

from __future__ import annotations

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
    assert sorted({name.split(".")[0] for name in _listed_packages()}) == TOP


def test_every_package_under_the_four_is_listed_so_a_wheel_carries_it():
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for top in TOP
        for init in (REPO / top).rglob("__init__.py")
    }
    assert found == set(_listed_packages())


def _listed_packages() -> list[str]:
    """[tool.setuptools] packages, listed one by one (subpackages too: setuptools puts only
    what is named into a wheel)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages: list[str] = config["tool"]["setuptools"]["packages"]
    return packages
