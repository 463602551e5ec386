"""Built-in verifiers, reward resolution, and the runner with real worker processes."""

from __future__ import annotations

import numpy as np
import pytest

from common.config import RewardSpec
from common.errors import ConfigError
from producer.rewards import RewardRunner, boxed_format, exact_match, math_verify, resolve


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [("42", "42", 1.0), (" 42\n", "42", 1.0), ("42.", "42", 0.0), ("4 2", "42", 0.0)],
)
def test_exact_match_compares_stripped_text(completion, answer, expected):
    assert exact_match(completion, answer) == expected


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        (r"so the answer is \boxed{1/2}", "0.5", 1.0),
        (r"\boxed{\frac{2}{4}}", "1/2", 1.0),
        (r"first \boxed{3} then \boxed{4}", "4", 1.0),
        (r"\boxed{5}", "4", 0.0),
        ("no box but 7", "7", 1.0),
        ("nothing here", "7", 0.0),
    ],
)
def test_math_verify_checks_the_last_boxed_answer_for_equivalence(completion, answer, expected):
    assert math_verify(completion, answer) == expected


def test_boxed_format_rewards_a_boxed_answer():
    assert boxed_format(r"x \boxed{2}", "") == 1.0
    assert boxed_format("2", "") == 0.0


def test_unknown_or_broken_reward_specs_fail_at_startup_naming_the_key():
    for spec in ("exact-match", "no_such_module:f", "reward_fixtures:missing", "reward_fixtures:not_callable"):
        with pytest.raises(ConfigError, match="rewards.fns"):
            resolve(spec)


async def test_rewards_are_weighted_and_summed_per_completion():
    specs = [RewardSpec("exact_match", 2.0), RewardSpec("reward_fixtures:length", 0.5)]
    runner = RewardRunner(specs, timeout_s=5, workers=1)
    try:
        scored = await runner.score(["7", "77", " 7 "], "7")
    finally:
        runner.close()
    np.testing.assert_allclose(scored.parts["exact_match"], [1, 0, 1])
    np.testing.assert_allclose(scored.rewards, [2 + 0.5, 0 + 1.0, 2 + 1.5])
    assert scored.num_errors == scored.num_timeouts == 0


async def test_a_raising_nan_or_non_numeric_reward_scores_zero_and_is_counted():
    specs = [RewardSpec("exact_match", 1.0), RewardSpec("reward_fixtures:raises", 1.0),
             RewardSpec("reward_fixtures:nan", 1.0), RewardSpec("reward_fixtures:not_a_number", 1.0)]  # fmt: skip
    runner = RewardRunner(specs, timeout_s=5, workers=1)
    try:
        scored = await runner.score(["1", "2"], "1")
    finally:
        runner.close()
    np.testing.assert_allclose(scored.rewards, [1.0, 0.0])
    assert scored.num_errors == 6
    assert runner.num_errors == 6


async def test_a_hanging_reward_times_out_and_the_runner_keeps_working():
    runner = RewardRunner([RewardSpec("reward_fixtures:hangs", 1.0)], timeout_s=0.5, workers=1)
    try:
        scored = await runner.score(["a", "b"], "x")
        assert scored.num_timeouts == 2
        np.testing.assert_allclose(scored.rewards, [0.0, 0.0])
        runner.specs = [RewardSpec("exact_match", 1.0)]
        again = await runner.score(["x", "y"], "x")
    finally:
        runner.close()
    np.testing.assert_allclose(again.rewards, [1.0, 0.0])
    assert runner.num_timeouts == 2


async def test_a_reward_stuck_beyond_its_alarm_gets_the_pool_killed_and_rebuilt():
    runner = RewardRunner([RewardSpec("reward_fixtures:hangs_hard", 1.0)], timeout_s=0.2, workers=1, hard_margin_s=1.0)
    try:
        scored = await runner.score(["a"], "x")
        assert scored.num_timeouts == 1
        assert runner.num_pool_restarts == 1
        runner.specs = [RewardSpec("exact_match", 1.0)]
        again = await runner.score(["x"], "x")
    finally:
        runner.close()
    np.testing.assert_allclose(again.rewards, [1.0])
