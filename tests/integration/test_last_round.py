"""The run's last version is evaluated through the producers and reported in its last metrics
line, whether or not it is a multiple of eval.every_steps: the learner waits for that round
(consumer/evaluation/__init__.py `await_last_round`). A fake-engine launch, about 10 s."""

from __future__ import annotations

from procs import read_jsonl, run_to_end

from common.files import run_files as RF


def test_the_last_version_is_evaluated_and_reported_in_the_last_line(tmp_path):
    run_dir = tmp_path / "run"
    fake = ["--engine", "fake", "--steps", "6", "--no-eval", "--no-live"]
    evals = ["--set", "eval.every_steps=4", "--set", "eval.max_prompts=4"]
    run_to_end(
        "launch",
        "--run-dir",
        str(run_dir),
        *fake,
        *evals,
        log=tmp_path / "launch.log",
        timeout_s=120,
    )
    metrics = read_jsonl(run_dir / RF.METRICS)
    last = metrics[-1]
    assert last["step"] == 6
    assert last["eval_version"] == 6  # not a multiple of 4: the run's last version
    assert 0 in [m.get("eval_version") for m in metrics]
    assert "| 6 | " in (run_dir / RF.SUMMARY).read_text()
    said = (run_dir / "consumer.log").read_text()
    assert "evaluating v6 through the producers (up to 120 s: eval.final_wait_s)" in said
