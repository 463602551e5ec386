"""How a reward function is called (its signature decides: producer/rewards/calls.py), and the
runner calling user rewards by name, per group and async in real spawn workers
(producer/rewards/worker.py), with the row's columns as the consumer sends them."""

from __future__ import annotations

import asyncio
import json
import logging

import numpy as np
import pytest

from common.config import RewardSpec
from common.errors import ConfigError
from producer.rewards.calls import CallPlan, MissingColumn, call_arguments, plan_call
from producer.rewards.runner import RewardRunner

ROW = {"prompt": "Length of the rod?", "answer": "12", "unit": "cm", "tolerance": 0.5}
COLUMNS = json.dumps({"unit": "cm", "tolerance": 0.5})


# -- the plan, from the signature ----------------------------------------------------------------
def test_names_decide_how_a_reward_is_called():
    def by_name(completion, answer, unit): ...

    def group(completions, *, tolerance=1.0): ...

    def anything(**kwargs): ...

    def original(text, ref): ...

    assert plan_call(by_name, "m:f") == CallPlan(
        False, False, ("completion", "answer", "unit"), frozenset({"completion", "answer", "unit"}),
        False,
    )  # fmt: skip
    assert plan_call(group, "m:f") == CallPlan(
        True, False, ("completions", "tolerance"), frozenset({"completions"}), False
    )
    assert plan_call(anything, "m:f") == CallPlan(False, False, (), frozenset(), True)
    assert plan_call(original, "m:f") == CallPlan(False, True, (), frozenset(), False)
    assert plan_call(by_name, "m:f").reads_columns
    assert not plan_call(lambda completion, answer, prompt: 0, "m:f").reads_columns
    assert plan_call(anything, "m:f").reads_columns


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda completion, completions: 0, "takes both 'completion' and 'completions'"),
        (lambda text: 0, "must take 'completion'"),
        (lambda a, b, c: 0, "must take 'completion'"),
        (lambda x, /, completion: 0, "positional-only parameter 'x'"),
    ],
)
def test_a_signature_that_fits_no_convention_is_refused_naming_the_reward(fn, why):
    with pytest.raises(ConfigError, match=why) as info:
        plan_call(fn, "my_rewards:f")
    assert str(info.value).startswith("rewards.fns: 'my_rewards:f'")


def test_arguments_are_given_by_name_with_kwargs_taking_the_rest():
    def f(completion, unit, missing=3, **rest): ...

    args, kwargs = call_arguments(plan_call(f, "m:f"), "12 cm", ROW)
    assert args == ()
    assert kwargs == {
        "completion": "12 cm", "unit": "cm", "prompt": ROW["prompt"], "answer": "12",
        "tolerance": 0.5,
    }  # fmt: skip
    group = plan_call(lambda completions, answer: 0, "m:f")
    expected = {"completions": ["a", "b"], "answer": "12"}
    assert call_arguments(group, ["a", "b"], ROW) == ((), expected)
    original = plan_call(lambda text, ref: 0, "m:f")
    assert call_arguments(original, "a", ROW) == (("a", "12"), {})
    with pytest.raises(MissingColumn, match="takes 'difficulty', which is not a column of this"):
        call_arguments(plan_call(lambda completion, difficulty: 0, "m:f"), "a", ROW)


# -- in the runner's workers ---------------------------------------------------------------------
async def score(specs: list[str], texts: list[str], answer: str = "12", **row: object):
    async with (
        asyncio.timeout(60),
        RewardRunner([RewardSpec(s) for s in specs], timeout_s=1.0, workers=1) as runner,
    ):
        return await runner.score(texts, answer, **row), runner  # type: ignore[arg-type]


async def test_a_reward_reads_two_columns_of_the_row_by_name():
    scored, _ = await score(
        ["reward_fixtures:within_tolerance", "reward_fixtures:sees_everything"],
        ["12.4 cm", "13 cm", "12 m", "twelve"], prompt=ROW["prompt"], columns=COLUMNS,
    )  # fmt: skip
    np.testing.assert_array_equal(scored.parts["reward_fixtures:within_tolerance"], [1, 0, 0, 0])
    np.testing.assert_array_equal(scored.parts["reward_fixtures:sees_everything"], [1, 1, 1, 1])
    assert scored.num_errors == 0


async def test_the_prompt_reaches_rewards_as_text_or_as_chat_messages():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    text, _ = await score(["reward_fixtures:chat_turns"], ["4"], prompt="2+2?")
    turns, _ = await score(["reward_fixtures:chat_turns"], ["4"], prompt=chat)
    assert (text.rewards.tolist(), turns.rewards.tolist()) == ([-1.0], [2.0])


async def test_a_group_reward_gets_all_g_completions_in_one_call():
    scored, runner = await score(["reward_fixtures:rank_in_group"], ["12", "a", "abc", "ab"])
    np.testing.assert_allclose(scored.rewards, [10.0, 1.0, 1 / 4, 1 / 3], rtol=1e-6)
    assert (runner.num_calls, scored.num_errors) == (4, 0)  # counted per completion


async def test_a_group_reward_that_returns_a_wrong_count_or_a_nan_fails_what_it_must():
    wrong, _ = await score(["reward_fixtures:group_of_wrong_length"], ["a", "b", "c"])
    assert (wrong.rewards.tolist(), wrong.num_errors) == ([0.0, 0.0, 0.0], 3)
    nan, _ = await score(["reward_fixtures:group_with_a_nan"], ["a", "b", "c"])
    assert (nan.rewards.tolist(), nan.num_errors) == ([0.0, 1.0, 1.0], 1)


async def test_async_rewards_are_awaited_and_timed_like_the_others():
    scored, _ = await score(
        ["reward_fixtures:async_match", "reward_fixtures:async_group"],
        ["12", "12 cm", "x"], columns=COLUMNS,
    )  # fmt: skip
    np.testing.assert_array_equal(scored.parts["reward_fixtures:async_match"], [1, 0, 0])
    np.testing.assert_array_equal(scored.parts["reward_fixtures:async_group"], [0, 1, 0])
    hung, _ = await score(["reward_fixtures:async_hangs"], ["a", "b"])
    assert (hung.rewards.tolist(), hung.num_timeouts) == ([0.0, 0.0], 2)


async def test_the_original_signature_keeps_working_whatever_its_names():
    scored, _ = await score(["reward_fixtures:original_names"], ["12", "13"])
    assert scored.rewards.tolist() == [1.0, 0.0]


async def test_a_missing_column_or_unreadable_columns_are_counted_and_logged(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("asyncgrpo.producer"), "disabled", False)
    with caplog.at_level(logging.WARNING, logger="asyncgrpo.producer"):
        scored, _ = await score(["reward_fixtures:needs_a_column"], ["a", "b"], columns=COLUMNS)
        one = '{"difficulty": 2}'
        fine, _ = await score(["reward_fixtures:needs_a_column"], ["a"], columns=one)
        broken, _ = await score(["reward_fixtures:needs_a_column"], ["a"], columns="{nope}")
    assert (scored.rewards.tolist(), scored.num_errors) == ([0.0, 0.0], 2)
    assert (fine.rewards.tolist(), fine.num_errors) == ([2.25], 0)
    assert broken.num_errors == 1
    lines = [r.getMessage() for r in caplog.records if "(scored 0" in r.getMessage()]
    assert lines[0].startswith(
        "reward 'reward_fixtures:needs_a_column' takes 'difficulty', which is not a column of "
        "this row (its columns: unit, tolerance)"
    )
    assert "could not read the lease's columns (JSONDecodeError" in lines[1]
