"""Built-in verifiers, reward resolution, and the runner with real spawn worker processes."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from common.config import RewardSpec
from common.config.run import reward_names as part_names
from common.errors import ConfigError
from producer.rewards.builtins import boxed_format, exact_match, last_boxed, math_verify
from producer.rewards.calls import resolve
from producer.rewards.runner import RewardRunner
from producer.rewards.scoring import FakeRewards


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [("42", "42", 1.0), (" 42\n", "42", 1.0), ("42", " 42 ", 1.0), ("42.", "42", 0.0),
     ("4 2", "42", 0.0), ("042", "42", 0.0), ("", "42", 0.0)],
)  # fmt: skip
def test_exact_match_compares_stripped_text(completion, answer, expected):
    assert exact_match(completion, answer) == expected


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        (r"so the answer is \boxed{1/2}", "0.5", 1.0),
        (r"\boxed{\frac{2}{4}}", "1/2", 1.0),
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        (r"first \boxed{3} then \boxed{4}", "4", 1.0),
        (r"\boxed{5}", "4", 0.0),
        (r"\boxed{x^2 + 2x}", "x(x+2)", 1.0),
        ("no box: 3 apples and then 7", "7", 1.0),
        ("no box: 7 apples and then 3", "7", 0.0),
        ("it is -12", "-12", 1.0),
        ("nothing here", "7", 0.0),
        ("", "7", 0.0),
        (r"\boxed{7}", "", 0.0),
    ],
)
def test_math_verify_checks_the_last_boxed_answer_else_the_last_number(
    completion, answer, expected
):
    assert math_verify(completion, answer) == expected


def test_boxed_extraction_handles_nested_braces():
    assert last_boxed(r"\boxed{\frac{1}{\sqrt{2}}} and more") == r"\frac{1}{\sqrt{2}}"
    assert last_boxed("plain") is None


def test_boxed_format_rewards_a_non_empty_boxed_answer():
    assert boxed_format(r"x \boxed{2}", "") == 1.0
    assert boxed_format(r"\boxed{}", "") == 0.0
    assert boxed_format("2", "") == 0.0


def test_specs_resolve_to_builtins_or_imported_functions():
    assert resolve("exact_match") is exact_match
    assert resolve("reward_fixtures:length")("abc", "") == 3.0


@pytest.mark.parametrize(
    "spec",
    ["exact-match", "no_such_module:f", "reward_fixtures:missing", "reward_fixtures:not_callable",
     ":f", "reward_fixtures:"],
)  # fmt: skip
def test_unknown_or_broken_reward_specs_fail_naming_the_key_and_the_spec(spec):
    with pytest.raises(ConfigError, match=r"rewards\.fns") as info:
        resolve(spec)
    assert repr(spec) in str(info.value)


def test_a_runner_refuses_a_typo_at_construction_before_starting_workers():
    with pytest.raises(ConfigError, match="no_such"):
        RewardRunner([RewardSpec("no_such_reward")], timeout_s=1, workers=1)


def test_repeated_specs_get_distinct_part_names():
    assert part_names(["a", "b", "a", "a"]) == ["a", "b", "a#2", "a#3"]


async def test_rewards_are_weighted_and_summed_per_completion():
    specs = [
        RewardSpec("exact_match", 2.0),
        RewardSpec("reward_fixtures:length", 0.5),
        RewardSpec("reward_fixtures:numpy_half", 1.0),
        RewardSpec("reward_fixtures:is_answer", 1.0),
    ]
    async with asyncio.timeout(60), RewardRunner(specs, timeout_s=5, workers=1) as runner:
        scored = await runner.score(["7", "77", " 7 "], "7")
        empty = await runner.score([], "7")
    np.testing.assert_array_equal(scored.parts["exact_match"], [1, 0, 1])
    np.testing.assert_array_equal(scored.parts["reward_fixtures:is_answer"], [1, 0, 0])
    np.testing.assert_allclose(scored.rewards, [2 + 0.5 + 0.5 + 1, 0 + 1.0 + 0.5, 2 + 1.5 + 0.5])
    assert scored.rewards.dtype == np.float32
    assert scored.num_errors == scored.num_timeouts == 0
    assert empty.rewards.shape == (0,)
    assert runner.num_calls == 12


async def test_a_raising_exiting_nan_or_non_numeric_reward_scores_zero_and_is_counted():
    bad = ["raises", "exits", "nan", "inf", "not_a_number"]
    specs = [RewardSpec("exact_match"), *(RewardSpec(f"reward_fixtures:{b}") for b in bad)]
    async with asyncio.timeout(60), RewardRunner(specs, timeout_s=5, workers=1) as runner:
        scored = await runner.score(["1", "2"], "1")
        again = await runner.score(["1"], "1")
    np.testing.assert_array_equal(scored.rewards, [1.0, 0.0])
    assert scored.num_errors == 2 * len(bad)
    assert scored.num_timeouts == 0
    np.testing.assert_array_equal(again.rewards, [1.0])
    assert (runner.num_errors, runner.num_pool_restarts) == (3 * len(bad), 0)


async def test_a_hanging_reward_times_out_and_the_runner_keeps_working():
    spec = [RewardSpec("reward_fixtures:hangs_on_hang")]
    async with asyncio.timeout(60), RewardRunner(spec, timeout_s=0.5, workers=1) as runner:
        scored = await runner.score(["hang", "ok", "hang"], "x")
        again = await runner.score(["ok", "ok"], "x")
    np.testing.assert_array_equal(scored.rewards, [0.0, 1.0, 0.0])
    assert scored.num_timeouts == 2
    np.testing.assert_array_equal(again.rewards, [1.0, 1.0])
    assert (runner.num_timeouts, runner.num_errors, runner.num_calls) == (2, 0, 5)


async def test_a_reward_that_ignores_its_alarm_gets_the_pool_killed_and_rebuilt():
    spec = [RewardSpec("reward_fixtures:hangs_hard_on_hang")]
    async with (
        asyncio.timeout(60),
        RewardRunner(spec, timeout_s=0.2, workers=1, hard_margin_s=1.0) as runner,
    ):
        scored = await runner.score(["ok", "hang"], "x")
        again = await runner.score(["ok", "ok"], "x")
    np.testing.assert_array_equal(scored.rewards, [0.0, 0.0])  # the whole group is lost
    assert (scored.num_timeouts, runner.num_pool_restarts) == (2, 1)
    np.testing.assert_array_equal(again.rewards, [1.0, 1.0])
    assert again.num_timeouts == 0


async def test_a_reward_that_kills_its_worker_costs_one_pool_and_counts_as_errors():
    spec = [RewardSpec("reward_fixtures:kills_worker")]
    async with asyncio.timeout(60), RewardRunner(spec, timeout_s=5, workers=1) as runner:
        scored = await runner.score(["a", "b"], "x")
        assert (scored.num_errors, runner.num_pool_restarts) == (2, 1)
        scored = await runner.score(["c"], "x")
        assert (scored.num_errors, runner.num_pool_restarts) == (1, 2)


async def test_closing_with_a_group_in_flight_scores_it_zero_and_starts_no_new_pool():
    spec = [RewardSpec("reward_fixtures:hangs_on_hang")]
    runner = RewardRunner(spec, timeout_s=30, workers=1)
    async with asyncio.timeout(30):
        in_flight = asyncio.create_task(runner.score(["hang", "ok"], "x"))
        await asyncio.to_thread(runner._pool.ready.result)  # the worker is up
        await asyncio.sleep(0.5)  # and the group is in it, hanging
        runner.close()
        scored = await in_flight
    np.testing.assert_array_equal(scored.rewards, [0.0, 0.0])
    assert (scored.num_errors, runner.num_pool_restarts) == (2, 0)


def test_fake_rewards_are_a_seeded_coin_per_completion_that_follows_the_lease():
    rewards = FakeRewards(run_seed=3, p=0.25)
    first = rewards.score(lease_id=7, n=4000)
    assert first.dtype == np.float32
    assert set(np.unique(first)) <= {0.0, 1.0}
    assert first.mean() == pytest.approx(0.25, abs=0.03)
    assert np.array_equal(FakeRewards(run_seed=3, p=0.25).score(7, 4000), first)  # any producer
    assert not np.array_equal(rewards.score(8, 4000), first)


async def test_every_kind_of_reward_failure_is_logged_with_what_went_wrong(caplog, monkeypatch):
    # a logging.config call elsewhere in the session (import-linter's) may have disabled it
    monkeypatch.setattr(logging.getLogger("asyncgrpo.producer"), "disabled", False)
    specs = [RewardSpec(f"reward_fixtures:{b}") for b in ("raises", "nan", "not_a_number")]
    specs.append(RewardSpec("reward_fixtures:hangs_on_hang"))
    with caplog.at_level(logging.WARNING, logger="asyncgrpo.producer"):
        async with asyncio.timeout(60), RewardRunner(specs, timeout_s=0.5, workers=1) as runner:
            await runner.score(["hang", "ok"], "x")
            await runner.score(["ok"], "x")  # the same failures again: held back, not logged
    lines = [r.getMessage() for r in caplog.records]
    said = [line.split(" (scored 0")[0] for line in lines if "(scored 0" in line]
    assert "(reward_fixtures.py, line " in said[0]  # where the reward raised
    assert [line.split(" (reward_fixtures.py")[0] for line in said] == [
        "reward 'reward_fixtures:raises' raised RuntimeError: this reward is broken",
        "reward 'reward_fixtures:nan' returned nan (float), not a finite number",
        "reward 'reward_fixtures:not_a_number' returned 'yes' (str), not a finite number",
        "reward 'reward_fixtures:hangs_on_hang' timed out after 0.5 s (rewards.timeout_s)",
    ]
    assert "6 errors, 1 timeouts in this group of 2" in lines[0]
    assert sum("cut this producer's throughput" in line for line in lines) == 1


async def test_bounded_builtins_score_inline_with_no_pool_and_the_pools_values():
    texts, answer = ["7", " 7 ", "77", "\\boxed{7}", ""], "7"
    inline_specs = [RewardSpec("exact_match", 2.0), RewardSpec("boxed_format", 0.5)]
    pooled_specs = [*inline_specs, RewardSpec("reward_fixtures:length", 0.0)]
    async with asyncio.timeout(60), RewardRunner(inline_specs, timeout_s=5, workers=1) as inline:
        assert inline.inline
        assert inline._pool is None
        got = await inline.score(texts, answer)
    async with asyncio.timeout(60), RewardRunner(pooled_specs, timeout_s=5, workers=1) as pooled:
        assert not pooled.inline
        assert pooled._pool is not None
        want = await pooled.score(texts, answer)
    np.testing.assert_array_equal(got.rewards, want.rewards)
    for name in ("exact_match", "boxed_format"):
        np.testing.assert_array_equal(got.parts[name], want.parts[name])
    np.testing.assert_array_equal(got.parts["exact_match"], [1, 1, 0, 0, 0])
    assert (inline.num_calls, inline.num_errors, inline.num_timeouts) == (10, 0, 0)


async def test_a_scored_group_carries_each_reward_functions_own_scores_function_major():
    from common import wire
    from producer.engines.base import Completion
    from producer.rewards.scoring import TaskRewards

    class Letters:  # token id i decodes to the letter "a" + i
        def decode(self, ids):
            return "".join(chr(ord("a") + int(i)) for i in ids)

    specs = [RewardSpec("exact_match", 2.0), RewardSpec("boxed_format", 1.0)]
    lease = wire.Lease(1, 0, 0, 0, prompt="q", answer="b", messages=(), columns="")
    done = [Completion(np.array([i], np.int32), np.zeros(1, np.float32), "stop") for i in (1, 2)]
    async with asyncio.timeout(60), RewardRunner(specs, timeout_s=5, workers=1) as runner:
        scored = await TaskRewards(runner, Letters()).score_group(lease, done)
    assert scored.parts.tolist() == [[1.0, 0.0], [0.0, 0.0]]  # [F, G], unweighted
    assert scored.rewards.tolist() == [2.0, 0.0]


async def test_a_groups_first_failed_call_names_the_reward_the_exception_and_its_line():
    specs = [RewardSpec("exact_match"), RewardSpec("reward_fixtures:raises")]
    async with asyncio.timeout(60), RewardRunner(specs, timeout_s=5, workers=1) as runner:
        scored = await runner.score(["1", "2"], "1")
    assert scored.first_error.startswith(
        "reward 'reward_fixtures:raises' raised RuntimeError: this reward is broken "
        "(reward_fixtures.py, line "
    )
    assert scored.first_error.endswith(': raise RuntimeError("this reward is broken"))')


async def test_a_group_whose_rewards_all_succeed_names_no_error():
    async with (
        asyncio.timeout(60),
        RewardRunner([RewardSpec("exact_match")], timeout_s=5, workers=1) as runner,
    ):
        scored = await runner.score(["1", "2"], "1")
    assert scored.first_error == ""


def test_a_first_error_is_cut_to_the_wires_bound():
    from common import wire
    from producer.rewards.runner import first_error

    text = first_error([("m:f", "error", "raised ValueError: " + "x" * 1000)])
    assert len(text) == wire.MAX_REWARD_ERROR_CHARS
    assert text.startswith("reward 'm:f' raised ValueError: x")
    assert text.endswith("...")
    assert first_error([]) == ""
