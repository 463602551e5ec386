"""The sweep's held-out score on a user's JSONL split agrees with the project's own greedy
evaluation of the same problems, and is scored by the config's module:function rewards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common import config as C
from common.errors import ConfigError
from common.task.synthetic import make_examples
from consumer import evaluation
from consumer.evaluation import score_model, score_run_ends
from consumer.evaluation.greedy import _greedy, load_model
from launch.demo_model import Recipe, build_demo_model
from producer.rewards.judge import HeldOutJudge

TINY = Recipe(learn_steps=4, sloppy_steps=2, batch_size=8)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("demo") / "model", recipe=TINY)


def user_config(tmp_path: Path, rows: list[dict[str, str]], fn: str) -> C.Config:
    path = tmp_path / "heldout.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return C.override(
        C.Config(),
        {
            "task.source": "jsonl", "task.path": str(path), "eval.path": str(path),
            "task.prompt_field": "question", "sampling.max_new_tokens": 8,
            "rewards.fns": [{"fn": fn, "weight": 1.0}],
        },
    )  # fmt: skip


def test_greedy_score_on_a_jsonl_split_is_the_greedy_completion_scored_by_the_user_reward(
    tmp_path, model_dir
):
    prompts = [e.prompt for e in make_examples("heldout", 12)]
    model, tokenizer = load_model(model_dir)
    tokenizer.padding_side = "left"
    texts = _greedy(model, tokenizer, prompts, "cpu", 8)  # the project's own greedy decoding
    answers = [t.strip() if i % 3 else "never" for i, t in enumerate(texts)]  # 4 of 12 wrong
    rows = [{"question": p, "answer": a} for p, a in zip(prompts, answers, strict=True)]
    cfg = user_config(tmp_path, rows, "reward_fixtures:sum_is_right")
    assert evaluation.has_heldout(cfg)
    assert evaluation.describe(cfg) == "mean reward, greedy, heldout.jsonl"

    score = score_model(cfg, model_dir, judge=HeldOutJudge)
    assert score.size == 12
    assert score.score == pytest.approx(8 / 12)


def test_a_malformed_split_names_its_line(tmp_path, model_dir):
    cfg = user_config(tmp_path, [{"question": "1+1=", "answer": "2"}], "exact_match")
    Path(cfg.eval.path).write_text('{"question": "1+1=", "answer": "2"}\nnot json\n')
    with pytest.raises(ConfigError, match=r"heldout.jsonl: line 2: not JSON"):
        score_model(cfg, model_dir, judge=HeldOutJudge)


def test_a_jsonl_task_without_eval_path_has_no_heldout_score():
    cfg = C.override(C.Config(), {"task.source": "jsonl", "task.path": "x.jsonl"})
    assert not evaluation.has_heldout(cfg)
    assert evaluation.describe(cfg) == ""


def test_a_finished_runs_start_and_final_snapshot_are_scored_into_eval_json(tmp_path, model_dir):
    """What `asyncgrpo launch` prints at the end of a JSONL task's run (launch/cli/run.py):
    eval.json, written once."""
    import torch
    from transformers import AutoModelForCausalLM

    from consumer.snapshots.publisher import Publisher

    prompts = [e.prompt for e in make_examples("heldout", 6)]
    model, tokenizer = load_model(model_dir)
    tokenizer.padding_side = "left"
    texts = _greedy(model, tokenizer, prompts, "cpu", 8)
    rows = [{"question": p, "answer": t.strip() if i % 2 else "never"}
            for i, (p, t) in enumerate(zip(prompts, texts, strict=True))]  # fmt: skip
    cfg = user_config(tmp_path, rows, "reward_fixtures:sum_is_right")
    run_dir = tmp_path / "run"
    assert score_run_ends(cfg, run_dir, model_dir, judge=HeldOutJudge) is None  # no snapshot yet
    state = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    publisher = Publisher(run_dir / "snapshots", model_dir, keep_last=2, on_published=print)
    for version in (1, 2):  # the same weights: the same score at the start and the end
        publisher.submit(state, version=version, step=version, dtype=torch.float32)
    publisher.close()

    result = score_run_ends(cfg, run_dir, model_dir, judge=HeldOutJudge)
    assert result is not None
    assert result["final_version"] == 2  # no final.json: the newest complete snapshot
    assert result["initial_accuracy"] == result["final_accuracy"] == pytest.approx(3 / 6)
    assert result["heldout_size"] == 6
    assert result["heldout"] == "mean reward, greedy, heldout.jsonl"
    assert json.loads((run_dir / "eval.json").read_text()) == result
