"""`asyncgrpo eval` scores a run's snapshot on that run's own task and rewards (its
config.toml), and refuses, with one line, a run whose task has no held-out rows instead of
scoring the built-in addition split (consumer/evaluation/heldout.py `eval_target`)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from common import config as C
from common.files import run_files as RF
from launch.cli import app


def _run_dir(tmp_path: Path, model: Path, *, eval_rows: int | None) -> Path:
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = ['task.source="jsonl"', f'task.path="{tmp_path / "train.jsonl"}"',
            f'model.path="{model}"', "sampling.max_new_tokens=4"]  # fmt: skip
    if eval_rows is not None:
        held = tmp_path / "held.jsonl"
        held.write_text("".join(json.dumps(r) + "\n" for r in rows[:eval_rows]))
        sets.append(f'eval.path="{held}"')
    run = tmp_path / "run"
    run.mkdir()
    C.write(C.apply_overrides(C.Config(), sets), run / RF.CONFIG)
    return run


def test_a_runs_snapshot_is_scored_on_its_own_held_out_rows_and_rewards(tmp_path, tiny_model_dir):
    run = _run_dir(tmp_path, tiny_model_dir, eval_rows=3)
    weights = tiny_model_dir / "model.safetensors"
    result = CliRunner().invoke(app, ["eval", str(run), "--snapshot", str(weights)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("mean reward, greedy, held.jsonl: ")
    assert result.stdout.strip().endswith("(n = 3)")


def test_a_run_without_held_out_rows_is_refused_naming_the_key(tmp_path, tiny_model_dir):
    run = _run_dir(tmp_path, tiny_model_dir, eval_rows=None)
    result = CliRunner().invoke(app, ["eval", str(run)])
    assert result.exit_code == 2
    assert "has no held-out rows to score" in result.output
    assert "eval.path" in result.output
    assert "accuracy" not in result.output  # never the addition split instead


def test_eval_path_gives_a_run_its_held_out_rows(tmp_path, tiny_model_dir):
    run = _run_dir(tmp_path, tiny_model_dir, eval_rows=None)
    held = tmp_path / "other.jsonl"
    held.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    weights = tiny_model_dir / "model.safetensors"
    result = CliRunner().invoke(
        app, ["eval", str(run), "--snapshot", str(weights), "--eval-path", str(held)]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("mean reward, greedy, other.jsonl: ")
    assert result.stdout.strip().endswith("(n = 1)")
