"""The signal watch: whether arriving groups carry a learning signal, why not, when to stop."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from common import wire
from consumer.no_signal import SignalWatch, budget_text


def group(rewards: list[float], *, errors: int = 0, error: str = "", prompt=(1, 2)) -> wire.Group:
    g = len(rewards)
    return wire.Group(
        lease_id=0,
        producer_id="p",
        prompt_index=0,
        behavior_version=0,
        prompt_ids=np.array(prompt, np.int32),
        completion_ids=np.ones(g, np.int32),
        completion_lens=np.ones(g, np.int32),
        behavior_logp=np.full(g, -1.0, np.float32),
        token_versions=np.zeros(0, np.int32),
        rewards=np.array(rewards, np.float32),
        finish_reasons=("stop",) * g,
        temperature=1.0,
        num_reward_errors=errors,
        reward_error=error,
    )


def test_a_group_with_unequal_rewards_ends_the_streak_and_counts_as_signal():
    watch = SignalWatch(max_groups=10, max_s=0)
    for t in range(3):
        watch.add(group([0, 0]), now=t)
    assert watch.streak.groups == 3
    watch.add(group([0, 1]), now=3)
    assert (watch.groups, watch.with_signal, watch.streak.groups) == (4, 1, 0)
    assert watch.why() == ""
    assert not watch.exhausted(now=1e9)


def test_the_budget_is_spent_by_count_or_by_time_while_groups_arrive():
    by_count = SignalWatch(max_groups=3, max_s=0)
    for t in range(2):
        by_count.add(group([1, 1]), now=t)
    assert not by_count.exhausted(now=100)
    by_count.add(group([1, 1]), now=2)
    assert by_count.exhausted(now=2)
    by_time = SignalWatch(max_groups=0, max_s=60)
    by_time.add(group([0, 0]), now=10)
    assert not by_time.exhausted(now=69.9)
    assert by_time.exhausted(now=70)
    off = SignalWatch(max_groups=0, max_s=0)
    off.add(group([0, 0]), now=0)
    assert not off.exhausted(now=1e9)


def test_a_constant_reward_is_named_with_its_value_and_the_dry_run():
    watch = SignalWatch(max_groups=0, max_s=0)
    for t in range(5):
        watch.add(group([0, 0, 0]), now=t)
    assert watch.why().startswith("every completion scored 0: is the task too hard or too easy")
    assert "asyncgrpo launch --dry-run" in watch.why()
    watch.add(group([1, 1, 1]), now=6)  # all right, all wrong: each group equal, not all alike
    assert watch.why().startswith("every completion of each group scored the same")


def test_failing_rewards_are_named_with_the_first_failures_line():
    watch = SignalWatch(max_groups=0, max_s=0)
    first = "reward 'r:f' raised IndexError: list index out of range (r.py, line 2: x[5])"
    watch.add(group([0, 0], errors=2, error=first), now=0)
    watch.add(group([0, 0], errors=2, error="reward 'r:f' raised IndexError: again"), now=1)
    assert watch.why() == (
        f"reward calls failed in every group (first: {first}); a failed call scores 0"
    )
    watch.add(group([0, 0]), now=2)  # one group without a failure: no longer "every group"
    assert "reward calls failed in 2 of them" in watch.why()


def test_prompts_the_tokenizer_cannot_read_are_named():
    watch = SignalWatch(
        max_groups=0, max_s=0, unknown_id=17, unknown_token="<unk>", unknown_hint="knows digits"
    )
    for t in range(3):
        watch.add(group([0, 0], prompt=(17, 3, 17)), now=t)
    assert "hold tokens the model's tokenizer does not know (<unk>)" in watch.why()
    assert "(knows digits; docs/custom_task/README.md)" in watch.why()
    assert "docs/custom_task/README.md" in watch.why()


def test_the_state_written_to_signal_json_carries_totals_streak_and_reason():
    watch = SignalWatch(max_groups=100, max_s=30)
    watch.add(group([0, 1]), now=0)
    watch.add(group([0, 0]), now=5)
    watch.add(group([0, 0]), now=12.5)
    state = watch.state(now=12.5, stopped=True)
    assert dataclasses.asdict(state) | {"why": ""} == {
        "groups": 3,
        "with_signal": 1,
        "streak": 2,
        "streak_s": 7.5,
        "why": "",
        "stopped": True,
        "max_groups": 100,
        "max_s": 30,
        "first_error": "",
    }
    assert state.why == watch.why()


@pytest.mark.parametrize(
    ("groups", "seconds", "text"),
    [
        (2000, 300, "run.no_signal_groups = 2000 or run.no_signal_s = 300 s"),
        (2000, 0, "run.no_signal_groups = 2000"),
        (0, 60, "run.no_signal_s = 60 s"),
    ],
)
def test_the_budget_is_named_by_its_keys(groups, seconds, text):
    assert budget_text(groups, seconds) == text


def test_the_reason_a_run_stops_names_the_streak_the_budget_and_why():
    watch = SignalWatch(max_groups=3, max_s=0)
    for t in (0, 10, 41):
        watch.add(group([0, 0]), now=t)
    assert watch.exhausted(now=41)
    assert watch.stop_reason(now=41) == (
        "no learning signal in 3 groups in a row over 41 s (run.no_signal_groups = 3): "
        + watch.why()
    )


def test_the_runs_first_reward_failure_is_kept_though_its_group_had_a_signal():
    watch = SignalWatch(max_groups=10, max_s=0)
    watch.add(group([0, 1], errors=1, error="reward 'r' raised ValueError: x (r.py, line 3)"), 0)
    watch.add(group([0, 1], errors=1, error="reward 'r' raised ValueError: y (r.py, line 3)"), 1)
    assert watch.streak.groups == 0  # every group had a signal
    assert watch.state(2).first_error == "reward 'r' raised ValueError: x (r.py, line 3)"
