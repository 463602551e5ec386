"""The lock files say what the suite ran on: every declared dependency pinned, bounds honest."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins(name: str) -> dict[str, str]:
    """{normalised package name: pinned version} of a lock file in .ci/."""
    out = {}
    for line in (ROOT / ".ci" / name).read_text().splitlines():
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if m:
            out[norm(m[1])] = m[2]
    return out


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(*extras: str) -> list[Requirement]:
    """The requirements of the project and of `extras`, an extra that names the project's own
    (`asyncgrpo[data]`) replaced by that extra's requirements."""
    out = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in extras:
        for req in map(Requirement, PROJECT["optional-dependencies"][extra]):
            if norm(req.name) == norm(PROJECT["name"]):
                out += [r for r in declared(*req.extras) if r not in out]
            else:
                out.append(req)
    return out


def test_the_cpu_lock_pins_every_declared_dependency_inside_its_range() -> None:
    locked = pins("lock.txt")
    for req in declared("dev"):
        assert norm(req.name) in locked, f"{req.name} is not in .ci/lock.txt"
        assert req.specifier.contains(locked[norm(req.name)], prereleases=True), (
            f"{req.name}=={locked[norm(req.name)]} in .ci/lock.txt is outside {req}"
        )
    assert locked["torch"].endswith("+cpu"), "CI's torch must be the CPU build"


def test_the_gpu_lock_pins_the_runtime_and_vllm_inside_their_ranges() -> None:
    locked = pins("lock-gpu.txt")
    for req in declared("vllm"):
        assert norm(req.name) in locked, f"{req.name} is not in .ci/lock-gpu.txt"
        assert req.specifier.contains(locked[norm(req.name)], prereleases=True), req


@pytest.mark.parametrize("req", declared("dev"), ids=lambda r: r.name)
def test_each_lower_bound_is_the_version_the_lowest_run_tests(req: Requirement) -> None:
    """A bound moved without re-running `bash .ci/lock lowest` fails here."""
    lows = [s.version for s in req.specifier if s.operator == ">="]
    assert len(lows) == 1, f"{req}: give one lower bound (>=)"
    assert Version(pins("lowest.txt")[norm(req.name)]) == Version(lows[0]), (
        f"{req}: .ci/lowest.txt tests another version; run `bash .ci/lock lowest`"
    )
