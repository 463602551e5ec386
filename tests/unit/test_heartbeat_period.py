"""The heartbeat rule (common/net/heartbeat.py) and the consumer's record of the periods it sent
(consumer/server/liveness.py: `SentPeriods`): heartbeats per second bounded whatever the number
of producers, and silences tolerated in proportion to the period in use, on both sides."""

from __future__ import annotations

import pytest

from common.net.heartbeat import period_s, silence_limit_s
from consumer.server.liveness import Liveness, SentPeriods

WINDOW_SLACK_S = 5.0  # consumer/server/liveness.py


@pytest.mark.parametrize(
    ("live", "period"), [(0, 1.0), (1, 1.0), (64, 1.0), (65, 65 / 64), (128, 2.0), (1024, 16.0)]
)
def test_the_period_grows_with_live_producers_and_never_drops_below_the_floor(live, period):
    assert period_s(live, floor_s=1.0, max_per_s=64.0) == period
    assert live / period <= max(64.0, live / 1.0)  # heartbeats per second, all producers


def test_the_silence_tolerated_is_the_configured_timeout_or_three_periods():
    assert silence_limit_s(30.0, 1.0) == 30.0  # nothing changes at the shortest period
    assert silence_limit_s(3.0, 0.2) == 3.0  # nor with a short configured timeout
    assert silence_limit_s(30.0, 16.0) == 3 * 16.0
    assert silence_limit_s(300.0, 16.0) == 300.0


def test_the_period_sent_follows_the_live_count_and_the_longest_outlives_a_drop():
    periods = SentPeriods(floor_s=1.0, max_per_s=64.0)
    assert periods.current(10, now=0.0) == 1.0
    assert periods.current(1024, now=1.0) == 16.0
    assert periods.longest_s == 16.0
    assert periods.timeout_s(30.0) == 3 * 16.0
    # most producers left: the period sent drops at once, but a producer that heard 16 s may
    # sleep that long before it hears the new one: 16 s is still tolerated meanwhile
    assert periods.current(64, now=2.0) == 1.0
    assert periods.longest_s == 16.0
    now = 2.0
    while now < 2.0 + 16.0 + WINDOW_SLACK_S:
        now += 0.5
        periods.current(64, now)
        if now <= 1.0 + 16.0 + WINDOW_SLACK_S:
            assert periods.longest_s == 16.0, now
    for _ in range(200):  # two windows later it is forgotten
        now += 0.5
        periods.current(64, now)
    assert periods.longest_s == 1.0
    assert periods.timeout_s(30.0) == 30.0


def test_a_producer_heartbeating_at_the_long_period_is_not_gone_and_a_silent_one_is():
    periods, liveness = SentPeriods(floor_s=1.0, max_per_s=64.0), Liveness()
    period = periods.current(1024, now=0.0)
    liveness.registered("beating", 0.0)
    liveness.registered("silent", 0.0)
    gone: dict[str, float] = {}
    for now in (period * k for k in range(1, 11)):  # 160 s of heartbeats at the long period
        liveness.heard("beating", now)
        periods.current(1024, now)
        limit = periods.timeout_s(30.0)
        assert limit == 3 * period  # beyond net.producer_timeout_s = 30
        gone.update(dict.fromkeys(liveness.silent(now, limit), now))
    # not at 32 s (two long periods: the configured 30 s would have taken it), but at the
    # first look after three periods (48 s)
    assert gone == {"silent": 4 * period}
    assert len(liveness) == 1
