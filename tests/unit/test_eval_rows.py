"""consumer/data/sources.py `round_rows`: the held-out prompts of evaluation during training,
for the built-in task and a custom one alike."""

from __future__ import annotations

import json

import pytest

from common import config as C
from common.errors import ConfigError
from common.task.synthetic import make_examples
from consumer.data.sources import round_rows


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_synthetic_task_evaluates_the_first_prompts_of_its_held_out_split():
    cfg = C.apply_overrides(C.Config(), ["eval.every_steps=5", "eval.max_prompts=3"])
    rows = round_rows(cfg)
    assert [(r.prompt, r.answer) for r in rows] == [
        (e.prompt, e.answer) for e in make_examples("heldout", 3)
    ]


def test_a_custom_task_reads_eval_path_like_task_path_with_its_fields(tmp_path):
    train = write(tmp_path / "train.jsonl", [{"question": "1-1", "result": 0}])
    held = write(tmp_path / "held.jsonl", [{"question": f"{i}-1", "result": i - 1, "unit": "cm"}
                                           for i in range(5)])  # fmt: skip
    cfg = C.apply_overrides(C.Config(), [
        "eval.every_steps=5", "eval.max_prompts=2", "task.source=jsonl", f"task.path={train}",
        "task.prompt_field=question", "task.answer_field=result", f"eval.path={held}",
    ])  # fmt: skip
    rows = round_rows(cfg)
    assert [(r.prompt, r.answer) for r in rows] == [("0-1", "-1"), ("1-1", "0")]
    assert json.loads(rows[0].columns) == {"unit": "cm"}


def test_task_eval_path_is_read_as_eval_path_and_bad_data_is_refused_naming_where(tmp_path):
    held = write(tmp_path / "held.jsonl", [{"prompt": "a", "answer": "b"}])
    cfg = C.apply_overrides(C.Config(), ["eval.every_steps=5", f"task.eval_path={held}"])
    assert [r.prompt for r in round_rows(cfg)] == ["a"]
    bad = write(tmp_path / "bad.jsonl", [{"answer": "b"}])
    with pytest.raises(ConfigError, match=r"bad\.jsonl: line 1: no field 'prompt'"):
        round_rows(C.apply_overrides(cfg, [f"eval.path={bad}"]))
    with pytest.raises(ConfigError, match=r"eval\.path"):  # the key that named the file
        round_rows(C.apply_overrides(cfg, [f"eval.path={tmp_path / 'none.jsonl'}"]))
