"""A starved producer's pause between lease requests: jittered, growing to a cap, never zero,
and a wait on a condition that a reply's own change-counter bump does not end."""

from __future__ import annotations

import asyncio
import random

import pytest

from producer.backoff import Backoff
from producer.state import Changes


def test_the_pauses_double_to_the_cap_within_their_jitter_band():
    backoff = Backoff(0.05, 1.0, random.Random(0))
    for _ in range(100):
        backoff.reset()
        waits = [backoff.next_s() for _ in range(8)]
        bounds = [min(1.0, 0.05 * 2**n) for n in range(8)]
        assert all(b / 2 <= w <= b for w, b in zip(waits, bounds, strict=True))
    assert bounds[-1] == 1.0


def test_pauses_are_spread_and_reset_starts_again_small():
    backoff = Backoff(0.05, 1.0, random.Random(1))
    for _ in range(10):
        backoff.next_s()
    spread = {round(backoff.next_s(), 6) for _ in range(20)}
    assert len(spread) == 20  # never the same pause twice
    assert min(spread) >= 0.5  # at the cap
    backoff.reset()
    assert backoff.next_s() <= 0.05


def test_a_backoff_is_refused_a_zero_or_inverted_range():
    with pytest.raises(AssertionError):
        Backoff(0.0, 1.0, random.Random(0))
    with pytest.raises(AssertionError):
        Backoff(2.0, 1.0, random.Random(0))


async def test_wait_for_outlasts_changes_that_leave_its_condition_false():
    async with asyncio.timeout(10):
        changes, ready = Changes(), {"value": False}
        waiter = asyncio.create_task(changes.wait_for(lambda: ready["value"], 60.0))
        for _ in range(5):  # e.g. the lease reply itself, heartbeats: the condition stays false
            changes.bump()
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert not waiter.done()
        ready["value"] = True
        changes.bump()
        await waiter  # returns at the change that makes it true, long before 60 s


async def test_wait_for_returns_after_its_timeout_when_nothing_changes():
    async with asyncio.timeout(10):
        await Changes().wait_for(lambda: False, 0.01)
