"""bench/device_vllm.py's CPU-side logic: the demo phase builds its models in a child process
before vLLM starts (so vLLM forks before CUDA is initialised), and every agreement table row has
its bf16 floor beneath it. The GPU phases themselves run on a GPU machine only."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    """The script as a module; the environment defaults it sets on import are undone after."""
    saved = dict(os.environ)
    spec = importlib.util.spec_from_file_location("device_vllm", ROOT / "bench" / "device_vllm.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        os.environ.clear()
        os.environ.update(saved)


class EngineStarted(Exception):
    pass


@pytest.fixture
def events(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What the demo phase does, in order: child processes it runs and the engine it starts (a
    stand-in that stops the phase there). Building the demo model in the phase's own process
    fails the test."""
    import launch.demo_model
    import producer.engines.vllm

    seen: list[Any] = []

    def engine(model_dir: Path, vcfg: Any, *, seed: int) -> None:
        seen.append(("engine", model_dir))
        raise EngineStarted

    def in_process(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the demo model was built in the phase's own process")

    monkeypatch.setattr(producer.engines.vllm, "VLLMEngine", engine)
    monkeypatch.setattr(launch.demo_model, "ensure_demo_model", in_process)
    return seen


def fake_child(work: Path, seen: list[Any], rc: int = 0) -> Any:
    def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
        seen.append(("child", cmd[2:]))
        if rc == 0:
            for name in ("demo_a", "demo_b"):
                (work / name).mkdir()
                (work / name / "config.json").write_text("{}")
            (work / "demo_build.json").write_text(json.dumps({"build_s": 1.5}))
        return subprocess.CompletedProcess(cmd, rc)

    return run


def test_the_demo_phase_builds_its_models_in_a_child_before_vllm_starts(
    bench: ModuleType, events: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(bench.subprocess, "run", fake_child(tmp_path, events))
    with pytest.raises(EngineStarted):
        bench.phase_demo(tmp_path)
    assert events == [
        ("child", ["demo_build", "--work", str(tmp_path)]),
        ("engine", tmp_path / "demo_a"),
    ]


def test_built_demo_models_are_reused_and_a_failed_build_starts_no_engine(
    bench: ModuleType, events: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(bench.subprocess, "run", fake_child(tmp_path, events, rc=1))
    assert bench.phase_demo(tmp_path) == {"error": "demo_build failed (see this phase's log)"}
    assert events == [("child", ["demo_build", "--work", str(tmp_path)])]
    events.clear()
    for name in ("demo_a", "demo_b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    with pytest.raises(EngineStarted):
        bench.phase_demo(tmp_path)
    assert events == [("engine", tmp_path / "demo_a")]


def stats(mean_abs: float) -> dict[str, Any]:
    return {"mean_abs": mean_abs, "max_abs": 0.5, "tis_mean": 1.0, "frac_truncated": 0.0,
            "tokens": 1024}  # fmt: skip


def agreement(floor: float | None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for w, other in (("A", "B"), ("B", "A")):
        for temp in (1.0, 0.7):
            res[f"{w}_T{temp}"] = {"fp32": stats(0.04), "bf16": stats(0.06), f"fp32_{other}":
                                   stats(0.9)}  # fmt: skip
            if floor is not None:
                res[f"{w}_T{temp}"]["bf16_floor"] = stats(floor)
    return res


def test_every_agreement_row_has_the_bf16_floor_beneath_it(bench: ModuleType):
    summary = {"build": {}, "qwen05": agreement(0.053), "demo": agreement(0.009)}
    rows = bench.table(summary)
    labels = [label for label, _ in rows]
    for name, floor in (("qwen05", "0.0530"), ("demo", "0.0090")):
        for w in ("A", "B"):
            for temp in bench.TEMPERATURES:
                i = labels.index(f"{name} {w} T={temp} bf16")
                assert rows[i + 1][0].strip() == "bf16 floor (fp32-bf16)"
                assert rows[i + 1][1].startswith(f"mean|d|={floor} ")
    assert labels.count("  bf16 floor (fp32-bf16)") == 2 * 2 * len(bench.TEMPERATURES)


def test_results_without_the_floor_say_so(bench: ModuleType):
    rows = dict(bench.table({"build": {}, "qwen05": agreement(None)}))
    assert rows["  bf16 floor (fp32-bf16)"] == "n/a"
