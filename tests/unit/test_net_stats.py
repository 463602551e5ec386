"""common/files/net_stats.py: histograms in fixed log buckets (quantiles err high by at most one
bucket, ~9%), window differences, and netstats.json round trips."""

from __future__ import annotations

import pytest

from common.files.net_stats import (
    BOUNDS_S,
    Histogram,
    LoopTiming,
    NetStats,
    read_net_stats,
    write_net_stats,
)


def test_quantiles_are_bucket_bounds_at_most_one_bucket_high():
    h = Histogram()
    values = [0.001 * (i + 1) for i in range(100)]  # 1..100 ms
    for v in values:
        h.record(v)
    assert h.total() == 100
    p99, top = h.quantile(0.99), h.max()
    assert p99 is not None
    assert top is not None
    assert 0.099 <= p99 <= 0.099 * 2 ** (1 / 8) * 1.0001
    assert 0.1 <= top <= 0.1 * 2 ** (1 / 8) * 1.0001
    assert Histogram().quantile(0.5) is None
    h.record(1e6)  # beyond the last bound: the last bucket
    assert h.max() == BOUNDS_S[-1]


def test_a_window_is_the_difference_of_two_copies():
    h = Histogram()
    h.record(5.0)  # before the window: a startup stall
    before = h.copy()
    for _ in range(10):
        h.record(0.002)
    window = h.minus(before)
    assert window.total() == 10
    top = window.max()
    assert top is not None
    assert top < 0.0025


def test_netstats_round_trips_and_refuses_another_layout(tmp_path):
    timing = LoopTiming(heartbeats=3, lease_requests=2, lease_parked=1)
    timing.lease_service.record(0.0004)
    stats = NetStats.of(timing, unix_time=12.5, groups_trained=7)
    write_net_stats(tmp_path, stats)
    back = read_net_stats(tmp_path)
    assert back == stats
    assert back.process_cpu_s > 0
    with pytest.raises(ValueError, match="bucket layout"):
        NetStats.from_json({**stats.to_json(), "loop_gap": [0, 1]})
    assert read_net_stats(tmp_path / "missing") is None
