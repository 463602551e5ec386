"""The headline numbers: the reward over every arrived group beside the trained one, the share of
groups without signal, per-function means, the "no signal" warning, and a reward plot whose
axis follows the data (consumer/reward_tally.py, launch/headline.py, launch/report.py)."""

from __future__ import annotations

import numpy as np
from step_records import BASE

from common import wire
from common.config.run import reward_names
from common.files import metrics as M
from common.files import run_files as RF
from consumer.reward_tally import RewardTally
from launch.dashboard import summary_line
from launch.report import plot_reward, report, reward_lines, summarize


def _group(rewards: list[float], parts: list[list[float]] | None) -> wire.Group:
    G = len(rewards)
    return wire.Group(
        lease_id=1, producer_id="p", prompt_index=0, behavior_version=0,
        prompt_ids=np.array([5], np.int32), completion_ids=np.full(G, 3, np.int32),
        completion_lens=np.ones(G, np.int32), behavior_logp=np.full(G, -1.0, np.float32),
        token_versions=np.zeros(0, np.int32), rewards=np.array(rewards, np.float32),
        finish_reasons=("stop",) * G, temperature=1.0,
        reward_parts=np.array(parts or [], np.float32).reshape(-1),
    )  # fmt: skip


def test_the_tally_counts_every_arrived_group_and_each_reward_function():
    tally = RewardTally(reward_names(["exact_match", "boxed_format", "exact_match"]))
    tally.add(_group([2.0, 2.0], [[1, 1], [0, 0], [1, 1]]))  # all right: no signal
    tally.add(_group([0.0, 1.0], [[0, 0], [0, 1], [0, 0]]))
    fields = tally.fields()
    assert fields["reward_mean_seen"] == 1.25
    assert fields["frac_reward_zero_std"] == 0.5
    assert fields["reward_fn_means"] == {"exact_match": 0.5, "boxed_format": 0.25,
                                         "exact_match#2": 0.5}  # fmt: skip


def test_without_per_function_scores_the_tally_reports_none():
    tally = RewardTally(["exact_match"])
    tally.add(_group([1.0, 0.0], None))
    assert tally.fields()["reward_fn_means"] is None
    assert tally.fields()["reward_mean_seen"] == 0.5


def test_the_progress_line_leads_with_every_arrived_group_and_warns_without_signal():
    rec = M.StepRecord(**{**BASE, "reward_mean_seen": 0.8})
    line = summary_line(rec, 10, 1.0)
    assert "step 1/10 reward 0.800 (trained 0.500, equal 50%)" in line
    assert "no signal" not in line
    quiet = M.StepRecord(**{**BASE, "reward_mean_seen": 1.0, "frac_reward_zero_std": 0.95})
    assert "no signal: 95% of the groups had equal rewards" in summary_line(quiet, 10, 1.0)


def test_summary_md_has_both_rewards_the_functions_and_the_warning(tmp_path):
    lines = [
        {**BASE, "step": s, "reward_mean_seen": 0.2 * s, "frac_reward_zero_std": 0.3 * s + 0.05,
         "reward_fn_means": {"exact_match": 0.1 * s, "boxed_format": 0.5}}
        for s in (1, 2, 3)
    ]  # fmt: skip
    writer = M.JsonlWriter(tmp_path / RF.METRICS)
    for line in lines:
        writer.write(M.StepRecord(**line))
    writer.close()
    report(tmp_path)
    summary = (tmp_path / RF.SUMMARY).read_text()
    # three steps: windows of one step each, never the same steps twice
    assert "- reward mean (all arrived groups): first step 0.200, last step 0.600" in summary
    assert "- reward mean (trained groups): first step 0.500" in summary
    assert "- groups with equal rewards (no signal): first step 35%, last step 95%" in summary
    assert "- reward `exact_match` (unweighted, all arrived groups): first 0.100, last 0.300" in (
        summary
    )
    assert "- reward `boxed_format`" in summary
    assert "**warning**: no signal: 95% of the groups had equal rewards" in summary


def test_the_reward_plot_axis_follows_a_reward_above_one(tmp_path, monkeypatch):
    from launch import report as report_mod

    limits: list[tuple[float, float]] = []
    original = report_mod.save_figure

    def spy(fig, path):
        limits.append(fig.axes[0].get_ylim())
        return original(fig, path)

    monkeypatch.setattr(report_mod, "save_figure", spy)
    recs = [M.StepRecord(**{**BASE, "step": s, "reward_mean_seen": 0.5 * s}) for s in (1, 2, 3)]
    assert plot_reward(recs, tmp_path).stat().st_size > 0
    low, high = limits[-1]
    assert low < 0
    assert high >= 1.5


def test_summary_md_shows_the_newest_completions_sample(tmp_path):
    from common.files import completions_file as CF

    def row(step: int, text: str) -> CF.CompletionRow:
        return CF.CompletionRow(
            step=step, prompt_index=3, behavior_version=step - 1, prompt="1+1=", completion=text,
            reward=1.0, rewards={"exact_match": 1.0}, length=2, finish_reason="stop",
        )  # fmt: skip

    CF.append(tmp_path, [row(1, "old|one"), row(5, "2<eos>")])
    summary = summarize(tmp_path)
    assert "## Completions at step 5" in summary
    assert '| 5 | 3 | 4 | 1+1= | 2<eos> | 1.0 | {"exact_match": 1.0} | 2 | stop |' in summary
    assert "old" not in summary


def test_the_dashboard_shows_both_rewards_each_function_and_no_signal(tmp_path):
    from rich.console import Console

    from launch.dashboard import MetricsTail, render

    writer = M.JsonlWriter(tmp_path / RF.METRICS)
    means = {"exact_match": 0.3, "boxed_format": 0.9}
    line = {**BASE, "reward_mean_seen": 0.7, "frac_reward_zero_std": 0.92, "reward_fn_means": means}
    writer.write(M.StepRecord(**line))
    writer.close()
    tail = MetricsTail(tmp_path / RF.METRICS)
    tail.poll()
    console = Console(record=True, width=200)
    console.print(render(tail, steps=10, elapsed_s=1.0, restarts={}))
    text = console.export_text()
    assert "0.700 (trained 0.500, equal 92%)" in text
    assert "boxed_format 0.900 · exact_match 0.300" in text  # metrics.jsonl sorts its keys
    assert "92% of the groups had equal rewards" in text


def test_the_first_and_last_windows_never_share_a_step():
    from launch.report import windows

    assert [windows(n) for n in (1, 2, 3, 5, 19, 20, 300)] == [1, 1, 1, 2, 9, 10, 10]
    one = M.StepRecord(**{**BASE, "reward_mean_seen": 0.25})
    assert reward_lines([one])[0] == "- reward mean (all arrived groups): 0.250 (1 step)"
