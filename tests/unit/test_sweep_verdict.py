"""A sweep's verdict in summary.md and its plots' titles (seeds, spread, load; one seed on a
loaded machine labelled as such), and progress lines that name the setting and never count
past the step limit."""

from __future__ import annotations

from sweep_rows import row, sweep_dir

from launch.dashboard import step_text, summary_line
from launch.stress.plan import Setting
from launch.stress.results import add_speedups, aggregate, summary
from launch.stress.verdict import caveat, verdict


# -- the verdict --------------------------------------------------------------------------------
def test_the_verdict_gives_the_speedup_over_seeds_with_its_range_and_the_load():
    rows = [
        row(0, 0, 1000.0, load_mean=1.0, cores=4), row(2, 0, 1900.0, load_mean=1.4, cores=4),
        row(0, 1, 1000.0, load_mean=1.2, cores=4), row(2, 1, 2100.0, load_mean=1.6, cores=4),
    ]  # fmt: skip
    add_speedups(rows)
    text = "\n".join(verdict(aggregate(rows), rows))
    assert "max_staleness 2 (2 producers, IS off): 2.00× (1.90–2.10 over 2 seeds) the " \
        "synchronous steps/hour, faster on every seed" in text  # fmt: skip
    assert "load average 1.3 on 4 usable cores" in text
    assert "not loaded" in text
    assert "Seeds per setting: 2" in text
    assert "noisy" not in text
    assert caveat(aggregate(rows), rows) == "2 seeds per setting: mean, error bars lowest–highest"


def test_seeds_that_disagree_give_no_clear_difference():
    rows = [row(0, 0, 1000.0), row(2, 0, 1100.0), row(0, 1, 1000.0), row(2, 1, 900.0)]
    add_speedups(rows)
    assert "no clear difference (the seeds disagree)" in "\n".join(verdict(aggregate(rows), rows))


def test_one_seed_on_a_loaded_machine_is_labelled_a_single_noisy_measurement(tmp_path):
    rows = [row(0, 0, 1000.0, load_mean=7.9, cores=2), row(2, 0, 960.0, load_mean=8.1, cores=2)]
    out = sweep_dir(tmp_path, rows)
    text = (out / "summary.md").read_text()
    assert "0.96× the synchronous steps/hour, slower (one seed)" in text
    assert "load average 8.0 on 2 usable cores" in text
    assert "a loaded machine" in text
    assert "**One seed on a loaded machine: a single noisy measurement, not a result.**" in text
    assert text.index("## Verdict") < text.index("## Settings")
    said = caveat(aggregate(rows), rows)
    assert said == "one seed per setting: no error bars · a loaded machine: a single noisy " \
        "measurement"  # fmt: skip


def test_a_sweep_without_a_load_measurement_still_gets_its_verdict():
    rows = [row(0, 0, 1000.0), row(1, 0, 1500.0)]
    add_speedups(rows)
    text = summary(rows, [], [])
    assert "1.50× the synchronous steps/hour, faster (one seed)" in text
    assert "Load:" not in text
    assert "One seed gives no spread: `--seeds 0,1,2`" in text


# -- progress lines -----------------------------------------------------------------------------
def test_a_progress_line_never_counts_past_the_step_limit():
    assert step_text(3, 30) == "step 3/30"
    assert step_text(30, 30) == "step 30/30"
    assert step_text(59, 30, "to match the synchronous setting's 41.0 s of training") == (
        "step 59 (30 done, to match the synchronous setting's 41.0 s of training)"
    )
    assert step_text(301, 300) == "step 301 (300 done)"
    assert step_text(7, 0) == "step 7"  # run.steps = 0: until the prompts run out
    from common.files.metrics import StepRecord

    rec = StepRecord.from_json({
        "step": 59, "time_s": 9.0, "unix_time": 1.7e9, "step_wall_s": 0.1, "reward_mean": 0.5,
        "reward_std": 0.1, "frac_reward_zero_std": 0.0, "staleness_mean": 1.0,
        "staleness_max": 2, "staleness_hist": {}, "tokens_per_s": 10.0,
        "learner_idle_frac": 0.0, "wait_s": 0.0, "publish_submit_s": 0.0,
        "snapshot_write_s": 0.0, "num_completion_tokens": 5, "groups_trained": 1,
        "groups_dropped_stale": 0, "groups_dropped_zero_variance": 0,
        "groups_rejected_invalid": 0, "groups_expired": 0, "leases_open": 0,
        "rejected_messages": 0,
    })  # fmt: skip
    assert "59/30" not in summary_line(rec, 30, 9.0)


def test_a_settings_progress_label_names_its_staleness_and_seed():
    assert Setting(2, 2, "off", 1).describe() == "max_staleness 2, seed 1, 2 producers, IS off"
    assert Setting(0, 1, "token-truncate", 0).describe() == (
        "max_staleness 0, seed 0, 1 producer, IS token-truncate"
    )
