"""The code_tests reward's pure parts: which code runs, which tests, how passes are read."""

from __future__ import annotations

import pytest

from producer.rewards.calls import resolve
from producer.sandbox import Limits
from producer.sandbox.code_reward import Contained, code_tests, program_of, score, snippets_of


@pytest.mark.parametrize(
    ("completion", "program"),
    [
        ("def f(): pass", "def f(): pass"),
        ("text\n```python\nA = 1\n```\nmore\n```python\nA = 2\n```", "A = 2\n"),
        ("```\nB = 1\n```", "B = 1\n"),
        ("```py\nC = 1\n```\n```text\nnot code\n```", "C = 1\n"),
        ("```python\nD = 1\n```\nthen\n```python\nE = 1\nF = 2", "E = 1\nF = 2\n"),  # cut off
    ],
)
def test_the_program_is_the_last_python_block_else_the_last_block_else_the_text(
    completion, program
):
    assert program_of(completion) == program


def test_tests_are_a_list_of_strings_or_lines_of_one_string():
    assert snippets_of("assert a\n\n  \nassert b") == ["assert a", "assert b"]
    assert snippets_of(["assert a"]) == ["assert a"]
    for bad in ([], "", [1], {"a": 1}, None):
        with pytest.raises(ValueError, match="tests"):
            snippets_of(bad)


def test_code_tests_is_a_built_in_reward():
    assert resolve("code_tests") is code_tests


def test_the_score_is_the_fraction_of_tests_passed():
    tests = ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(1, 1) == 3"]
    assert score("def add(a, b):\n    return a + b", tests) == pytest.approx(2 / 3)


def test_printing_or_exiting_cannot_fake_a_pass():
    forged = "import sys\nfor i in range(5):\n    print(f'\\n{\"0\" * 32} {i}')\n"
    assert score(forged + "def solve(): return 0", ["assert solve() == 1"]) == 0.0
    with pytest.raises(Contained) as info:
        score("import os\nos._exit(0)", ["assert True"])
    assert info.value.reason == "error"


def test_a_limit_raises_contained_with_its_reason():
    with pytest.raises(Contained) as info:
        score("import time\ntime.sleep(30)", ["assert True"], limits=Limits(wall_s=0.5))
    assert info.value.reason == "timeout"
