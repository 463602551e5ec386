"""Environments in worker processes: a bad one costs its episode and a counted, logged reason,
never the producer (producer/episodes/runner.py).

Real spawned workers: a call that raises, one that outlives its alarm, one that ignores the alarm
(the pool is killed and replaced after the hard margin), one that kills its worker; each ends as
its kind, counted once, logged with the environment, the lease and the row; the next call in the
same runner works.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import pytest

from common import wire
from producer.episodes import Reply
from producer.episodes.calls import EnvCall
from producer.episodes.contract import End, Next
from producer.episodes.runner import EnvRunner

SPEC = wire.EpisodeSpec(
    env="env_fixtures:echo",
    max_turns=3,
    max_episode_tokens=64,
    timeout_s=0.5,
    latency_s=0.0,
    latency_alpha=1.5,
)
CALL = EnvCall(
    reply=Reply("x", (1,), "stop"),
    messages=[{"role": "assistant", "content": "x"}],
    turn=1,
    turns_left=2,
    state={},
    prompt="p",
    answer="a",
)


@pytest.mark.parametrize(
    ("env", "kind", "counter", "said"),
    [
        ("env_fixtures:raises", "error", "env_raised", "raised RuntimeError"),
        ("env_fixtures:hangs", "timeout", "env_timeouts", "timed out after 0.5 s"),
        ("env_fixtures:hangs_hard", "timeout", "env_timeouts", "outlived its hard deadline"),
        ("env_fixtures:kills_worker", "died", "env_worker_deaths", "took its worker process"),
        ("env_fixtures:returns_number", "bad_return", "env_bad_returns", "returned 3.0"),
    ],
)
@pytest.mark.timeout(120)
async def test_a_bad_environment_costs_its_call_counted_and_logged(
    env, kind, counter, said, caplog: pytest.LogCaptureFixture
):
    runner = EnvRunner(dataclasses.replace(SPEC, env=env), workers=1, hard_margin_s=1.0)
    try:
        with caplog.at_level(logging.WARNING, logger="asyncgrpo.producer"):
            async with asyncio.timeout(60):
                out = await runner.call(CALL, seed=0, where="lease 7 (row 9), episode 0, turn 1")
        assert out.kind == kind
        assert said in out.why
        assert runner.counters["env_errors"] == runner.counters[counter] == 1
        lines = [r.getMessage() for r in caplog.records if "environment" in r.getMessage()]
        assert any(
            env in line and "lease 7 (row 9)" in line and "env_error" in line for line in lines
        )
        if "hard" in said or kind == "died":
            assert runner.num_pool_restarts == 1
    finally:
        runner.close()


@pytest.mark.timeout(120)
async def test_calls_run_in_workers_and_the_state_comes_back():
    runner = EnvRunner(SPEC, workers=2)
    try:
        assert not runner.inline
        out = await runner.call(CALL, seed=0, where="w")
        assert out.result == Next((("user", "turn 1"),))
        assert out.state == {"seen": 1}
        again = dataclasses.replace(CALL, turn=3, turns_left=0, state={"seen": 2})
        assert (await runner.call(again, seed=0, where="w")).result == End(0.3)
        assert runner.counters["env_calls"] == 2
        assert "env_errors" not in runner.counters
    finally:
        runner.close()
