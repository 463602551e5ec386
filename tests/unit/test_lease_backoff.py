"""A starved producer's pause between lease requests: jittered, growing to a cap, never zero,
and a wait on a condition that a reply's own change-counter bump does not end; in a crowd, a
request that waits at the consumer for several heartbeat periods instead."""

from __future__ import annotations

import asyncio
import random

import pytest

from common import wire
from common.net.heartbeat import LEASE_WAIT_PERIODS, lease_wait_s
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


def test_in_a_crowd_the_pauses_span_half_the_heartbeat_period_to_all_of_it_at_once():
    backoff = Backoff(0.05, 1.0, random.Random(2))
    assert backoff.follow(16.0, floor_s=1.0)  # the consumer lengthened the period: crowded
    waits = [backoff.next_s() for _ in range(50)]
    assert all(4.0 <= w <= 16.0 for w in waits)  # from the first one on
    assert sum(w >= 8.0 for w in waits) >= 45  # at the cap after one pause


def test_at_the_shortest_period_the_pauses_are_as_built():
    backoff = Backoff(0.05, 1.0, random.Random(3))
    backoff.follow(16.0, floor_s=1.0)
    assert not backoff.follow(1.0, floor_s=1.0)  # the crowd left
    backoff.reset()
    assert backoff.next_s() <= 0.05
    assert max(backoff.next_s() for _ in range(20)) <= 1.0


async def crowd_asks(period_s: float, reply_empty_at_once: bool) -> tuple[list, list[float]]:
    """The lease requests (with the timeout each was given) of a real producer's lease loop
    that heard `period_s` (its floor: net.heartbeat_s = 1), and the pause after the first."""
    from test_worker_reload import info, scripted_producer

    async with scripted_producer() as producer:
        session, state = producer.session, producer.state
        assert session is not None
        assert session.spec.heartbeat_s == 1.0
        state.run_id = state.weights_run = "r"
        state.target, state.heartbeat_s = info(0), period_s
        asked, pauses = [], []

        async def request_status(msg, timeout_s=0.0):
            asked.append((msg, timeout_s))
            if reply_empty_at_once:  # a consumer with net.lease_wait_s = 0
                return wire.LeaseGrant(msg.req, (), wire.Status("r", 0, None))
            state.finished = True
            return None

        async def wait_for(predicate, timeout_s):
            pauses.append(timeout_s)
            state.finished = True  # the first pause is all this test needs

        producer.request_status = request_status  # type: ignore[method-assign]
        state.changed.wait_for = wait_for  # type: ignore[method-assign]
        async with asyncio.TaskGroup() as tg:
            await producer.lease_loop(tg, session)
        return asked, pauses


async def test_a_crowded_producer_asks_to_wait_four_periods_and_waits_that_long_for_the_reply():
    (msg, timeout_s), *_ = (await crowd_asks(16.0, reply_empty_at_once=False))[0]
    assert msg.wait_s == LEASE_WAIT_PERIODS * 16.0  # leases freed at a step find it waiting
    assert timeout_s > msg.wait_s  # the producer never gives up on a request still parked
    (msg, _), *_ = (await crowd_asks(1.0, reply_empty_at_once=False))[0]
    assert msg.wait_s == 0  # at the floor: the consumer's own net.lease_wait_s


async def test_a_crowd_answered_at_once_pauses_by_the_period_and_after_a_wait_briefly():
    _, pauses = await crowd_asks(16.0, reply_empty_at_once=True)
    assert 4.0 <= pauses[0] <= 16.0  # no parking: the crowd paces itself (Backoff.follow)
    _, pauses = await crowd_asks(1.0, reply_empty_at_once=True)
    assert pauses[0] <= 0.05  # as built


def test_the_wait_asked_is_the_consumers_at_the_floor_and_periods_in_a_crowd():
    assert lease_wait_s(1.0, floor_s=1.0) == 0.0
    assert lease_wait_s(16.0, floor_s=1.0) == LEASE_WAIT_PERIODS * 16.0
    assert lease_wait_s(1e6, floor_s=1.0) == wire.MAX_LEASE_WAIT_S
