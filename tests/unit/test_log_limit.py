"""A flood of the same event becomes one log line per interval, saying how many were held back."""

from __future__ import annotations

import logging

from common.net.log_limit import LogLimiter


def test_one_line_per_key_and_interval_with_the_count_held_back(caplog):
    now = [0.0]
    limiter = LogLimiter(logging.getLogger("t"), every_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t"):
        assert limiter.log("a", logging.WARNING, "bad %s", "x")
        assert not any(limiter.log("a", logging.WARNING, "bad %s", "x") for _ in range(999))
        assert limiter.log("b", logging.WARNING, "other")  # another key is not held back
        now[0] = 10.0
        assert limiter.log("a", logging.WARNING, "bad %s", "y")
        now[0] = 25.0
        assert limiter.log("a", logging.WARNING, "bad %s", "z")  # nothing held back since
    assert [r.getMessage() for r in caplog.records] == [
        "bad x",
        "other",
        "bad y (and 999 more like it in the last 10 s)",
        "bad z",
    ]
