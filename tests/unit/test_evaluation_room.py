"""Evaluation is one room (consumer/evaluation/): one module defines its entry points, one per way
of evaluating and each named for what it does; eval.json and the greedy evaluation's metrics
fields are written in one place; the learner's own evaluation is off, and says so, while the
producers evaluate."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from common import config as C
from consumer import evaluation

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("common", "consumer", "producer", "launch")
ENTRY = "consumer/evaluation/__init__.py"
ENTRY_POINTS = {
    "evaluate_in_learner", "evaluate_beside_replay", "evaluate_through_producers",
    "score_run_ends", "score_model", "greedy_accuracy", "eval_target", "dry_run",
}  # fmt: skip


def product_files() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py"))


def top_level_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_one_module_defines_every_evaluation_entry_point_and_no_other_evaluates():
    defined = {str(p.relative_to(ROOT)): top_level_functions(p) for p in product_files()}
    assert defined[ENTRY] >= ENTRY_POINTS
    elsewhere = {
        (where, name)
        for where, names in defined.items()
        for name in names
        if where != ENTRY and (name in ENTRY_POINTS or name.startswith("evaluate"))
    }
    assert not elsewhere, f"evaluation entry points outside {ENTRY}: {sorted(elsewhere)}"


def test_eval_json_and_the_greedy_fields_are_written_in_one_place_each():
    writes_eval_json, greedy_fields = [], []
    for path in product_files():
        where, text = str(path.relative_to(ROOT)), path.read_text()
        if "RF.EVAL).write" in text or '"eval.json").write' in text:
            writes_eval_json.append(where)
        tree = ast.parse(text)
        keys = [n for n in ast.walk(tree) if isinstance(n, ast.Dict)]
        if any(isinstance(k, ast.Constant) and k.value == "heldout_accuracy"
               for d in keys for k in d.keys):  # fmt: skip
            greedy_fields.append(where)
    assert writes_eval_json == [ENTRY]
    assert greedy_fields == ["consumer/evaluation/greedy.py"]


@pytest.mark.parametrize(
    ("sets", "every"),
    [
        (["eval.learner_every_steps=10"], 10),
        (["eval.learner_every_steps=10", "eval.every_steps=20"], 0),  # the producers evaluate
        (["eval.learner_every_steps=10", "task.source=jsonl", "task.path=x.jsonl"], 0),
        ([], 0),
    ],
)
def test_the_learner_evaluates_only_when_the_producers_do_not(sets, every, caplog, tmp_path):
    cfg = C.apply_overrides(C.Config(), sets)
    with caplog.at_level(logging.INFO, logger="asyncgrpo.consumer"):
        learner = evaluation.evaluate_in_learner(cfg, tmp_path)
    assert learner.every_steps == every
    said = [r.getMessage() for r in caplog.records if "learner's own evaluation" in r.getMessage()]
    if "eval.every_steps=20" in sets:
        assert said == [
            "eval.every_steps = 20: the producers evaluate during training; the learner's own "
            "evaluation (eval.learner_every_steps = 10) is off"
        ]
    else:
        assert said == []
    assert evaluation.evaluate_in_learner(cfg, None).every_steps == 0  # no model: nothing to run
