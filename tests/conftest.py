"""Shared fixtures: tiny models built here (no hub), CLI processes, GPU auto-skip.

`tests/` is on sys.path through this conftest, so `tiny_models` and `procs` import as modules.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import build_tiny_model


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-initialised 2-layer Qwen2 with a character tokenizer (float32, ~100k params)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
