"""`asyncgrpo launch --dry-run`: the run's first prompts sampled with its starting model and scored
by its rewards, every completion printed with its reward and each function's score, before any
training; exit 3 when no prompt carries a signal (consumer/evaluation/preflight.py,
launch/cli/dry_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from launch.cli import app


def _dry_run(tmp_path: Path, model: Path, *rewards: str) -> tuple[int, str, str]:
    rows = [{"question": f"{i}+{i}=", "result": str(2 * i)} for i in range(6)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fns = ", ".join(f'{{fn = "{fn}"}}' for fn in rewards)
    sets = [
        'task.source="jsonl"',
        f'task.path="{data}"',
        'task.prompt_field="question"',
        'task.answer_field="result"',
        f"rewards.fns=[{fns}]",
        "sampling.group_size=4",
        "sampling.max_new_tokens=4",
        "rewards.workers=1",
    ]
    args = ["launch", "--dry-run", "--model", str(model), *(a for s in sets for a in ("--set", s))]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def test_a_dry_run_prints_every_completion_its_reward_and_each_functions_score(
    tmp_path, tiny_model_dir
):
    code, out, err = _dry_run(tmp_path, tiny_model_dir, "reward_fixtures:length", "exact_match")
    assert code == 0, err
    assert "the first 4 prompts of the task, 4 completions each" in err
    assert out.startswith(
        "prompt 1: '0+0='  answer '0'\n  reward  reward_fixtures:length  exact_match  completion\n"
    )
    assert out.count("\nprompt ") == 3  # 4 prompts
    assert out.count("→ the rewards differ: a learning signal") >= 1
    assert "prompts have a learning signal (rewards that differ)" in err
    assert not (tmp_path / "runs").exists()  # nothing trained, no run directory


def test_a_dry_run_with_a_failing_reward_names_its_line_and_exits_3(tmp_path, tiny_model_dir):
    code, out, err = _dry_run(tmp_path, tiny_model_dir, "reward_fixtures:raises")
    assert code == 3, err
    assert out.count("→ every completion scored 0: no signal from this prompt") == 4
    assert (
        "reward calls failed: 16 (scored 0; first: reward 'reward_fixtures:raises' raised "
        "RuntimeError: this reward is broken (reward_fixtures.py, line " in err
    )
    assert "none of 4 prompts has a learning signal" in err


def test_a_dry_run_with_a_reward_that_cannot_import_is_one_line_and_exit_2(
    tmp_path, tiny_model_dir
):
    code, _, err = _dry_run(tmp_path, tiny_model_dir, "no_such_module:fn")
    assert code == 2
    assert err.splitlines()[-1].startswith("error: rewards.fns: cannot import 'no_such_module:fn'")
