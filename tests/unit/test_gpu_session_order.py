"""The GPU session runs the vLLM engine's tests first (tests/conftest.py): vLLM forks its engine
process, and the other GPU tests initialise CUDA in the test process."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import conftest


def test_vllm_tests_come_first_and_the_rest_keep_their_order():
    names = ["test_learner_gpu.py::a", "test_publication_gpu.py::b", "test_vllm_engine.py::c",
             "test_learner_gpu.py::d", "test_vllm_engine.py::e"]  # fmt: skip
    items = [SimpleNamespace(path=Path("tests/gpu") / n.split("::")[0], name=n) for n in names]
    conftest.vllm_tests_first(items)
    assert [i.name for i in items] == [
        "test_vllm_engine.py::c", "test_vllm_engine.py::e", "test_learner_gpu.py::a",
        "test_publication_gpu.py::b", "test_learner_gpu.py::d",
    ]  # fmt: skip
