"""consumer/evaluation/report.py and where it shows: summary.md's table, reward.png's points, the
progress line's text, the trackers' eval/ names."""

from __future__ import annotations

from step_records import BASE

from common.files.metrics import StepRecord
from consumer.evaluation.report import eval_lines, eval_series, eval_text
from consumer.loggers.names import by_step, namespaced
from launch.dashboard import summary_line

LEDGER = {
    "eval_leases_issued": 130, "eval_leases_answered": 128, "eval_leases_declined": 2,
    "eval_leases_expired": 0, "eval_prompts_skipped": 0, "eval_rounds_skipped": 1,
}  # fmt: skip


def line(step: int, version: int | None = None, pass_1: float = 0.0) -> StepRecord:
    result = {}
    if version is not None:
        result = {
            "eval_version": version, "eval_reward_mean": pass_1, "eval_pass_at_1": pass_1,
            "eval_pass_at_k": min(1.0, 2 * pass_1), "eval_k": 4, "eval_completion_len_mean": 3.5,
            "eval_prompts": 64,
        }  # fmt: skip
    return StepRecord(**{**BASE, "step": step, **LEDGER, **result})


RECORDS = [line(1), line(3, 0, 0.25), line(20), line(23, 20, 0.5), line(24)]


def test_each_evaluated_version_is_one_row_of_the_summary_with_the_eval_ledger():
    text = "\n".join(eval_lines(RECORDS))
    assert "| version | reward mean | pass@1 | pass@4 | mean length | prompts |" in text
    assert "| 0 | 0.250 | 0.250 | 0.500 | 3.5 | 64 |" in text
    assert "| 20 | 0.500 | 0.500 | 1.000 | 3.5 | 64 |" in text
    assert "issued 130, answered 128, given back 2, expired 0" in text
    assert "rounds skipped 1" in text


def test_the_progress_line_shows_the_newest_evaluation():
    text = eval_text(RECORDS)
    assert text == "eval v20 reward 0.500 pass@1 0.500 pass@4 1.000"
    assert summary_line(RECORDS[-1], 50, 9.0, evaluated=text).count("eval v20") == 1
    assert eval_text([line(1)]) == ""


def test_the_plot_puts_each_result_at_the_version_evaluated():
    (xs, ys, label), (_, ks, label_k) = eval_series(RECORDS)
    assert (xs, ys, ks) == ([0.0, 20.0], [0.25, 0.5], [0.5, 1.0])
    assert "pass@1" in label
    assert "pass@4" in label_k


def test_the_trackers_get_the_results_under_eval():
    names = namespaced(RECORDS[3])
    assert names["eval/eval_pass_at_k"] == 1.0
    assert names["eval/eval_version"] == 20.0
    assert names["eval/eval_leases_declined"] == 2.0


def test_the_trackers_get_a_result_at_the_version_it_evaluated():
    (at_step, ledger), (at_version, result) = by_step(RECORDS[3])
    assert (at_step, at_version) == (23, 20)  # the round of version 20 completed at step 23
    assert result["eval/eval_pass_at_1"] == 0.5
    assert result["eval/eval_version"] == 20.0
    assert "eval/eval_pass_at_1" not in ledger
    assert ledger["eval/eval_leases_declined"] == 2.0  # the ledger's counts: at the step
    assert by_step(RECORDS[2]) == [(20, namespaced(RECORDS[2]))]


def test_a_run_without_evaluation_has_no_section():
    plain = StepRecord(**BASE)
    assert eval_lines([plain]) == []
    assert eval_series([plain]) == []
