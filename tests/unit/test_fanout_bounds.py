"""consumer/snapshots/fanout.py keeps bounded records: a bad-source reason outside
`wire.BAD_SOURCE_REASONS` is counted under one name (`other`), a report naming an endpoint no
producer relays from keeps nothing, and `forget` drops a producer's records with it.

A registered producer could once name ledger counters (each distinct reason, cut to 32
characters, became `fetch_bad_source.<reason>` for ever) and grow the consumer's memory (every
reported endpoint was kept, never pruned).
"""

from __future__ import annotations

from collections import Counter

import pytest

from common import wire
from common.errors import WireError
from consumer.snapshots.fanout import FanOut


def fanout(tmp_path) -> tuple[FanOut, Counter[str]]:
    counts: Counter[str] = Counter()
    out = FanOut(tmp_path, max_children=2, count=lambda k, n: counts.update({k: n}))
    return out, counts


def relay_of(out: FanOut, producer_id: str, endpoint: str) -> None:
    """`producer_id` says it relays from `endpoint` (its request's version is not kept here)."""
    with pytest.raises(WireError):
        out.plan(wire.FetchRequest(1, producer_id, 7, -1, "", wire.Source(endpoint, "")), 0.0)


def done(producer_id: str, *bad: tuple[str, str]) -> wire.FetchDone:
    sources = tuple(wire.BadSource(e, r) for e, r in bad)
    return wire.FetchDone(2, producer_id, 7, "weights", True, 10, sources, False)


def test_reasons_outside_the_documented_set_are_counted_under_one_name(tmp_path):
    out, counts = fanout(tmp_path)
    relay_of(out, "r", "tcp://10.0.0.3:6000")
    forged = [("tcp://10.0.0.3:6000", f"forged-reason-{i:04}-" + "x" * 40) for i in range(500)]
    out.done(done("p", *forged[:250]))
    out.done(done("p", ("tcp://10.0.0.3:6000", "stalled"), *forged[250:]))
    reasons = {k for k in counts if k.startswith("fetch_bad_source.")}
    assert reasons == {"fetch_bad_source.other", "fetch_bad_source.stalled"}
    assert counts["fetch_bad_source.other"] == 1  # one report per endpoint per message
    for reason in wire.BAD_SOURCE_REASONS:
        out.done(done("p", ("tcp://10.0.0.3:6000", reason)))
        assert counts[f"fetch_bad_source.{reason}"] >= 1


def test_reports_keep_records_only_of_endpoints_a_producer_relays_from(tmp_path):
    out, _ = fanout(tmp_path)
    relay_of(out, "r", "tcp://10.0.0.3:6000")
    strangers = [(f"tcp://10.9.{i // 250}.{i % 250}:1", "refused") for i in range(11_000)]
    out.done(done("p", ("tcp://10.0.0.3:6000", "wrong_bytes"), *strangers))
    assert dict(out._bad) == {"tcp://10.0.0.3:6000": 1}


def test_forget_drops_a_producers_fetch_its_relay_and_its_relays_reports(tmp_path):
    out, _ = fanout(tmp_path)
    relay_of(out, "r", "tcp://10.0.0.3:6000")
    relay_of(out, "s", "tcp://10.0.0.4:6000")
    out.done(done("p", ("tcp://10.0.0.3:6000", "truncated"), ("tcp://10.0.0.4:6000", "refused")))
    out._slots["r"] = out._slots["s"] = None  # type: ignore[assignment]  # fetches in progress
    out.forget("r")
    assert set(out._relays) == {"s"}
    assert set(out._slots) == {"s"}
    assert set(out._bad) == {"tcp://10.0.0.4:6000"}
    out.forget("nobody")  # never seen: nothing changes
    out.forget("s")
    assert not out._relays
    assert not out._slots
    assert not out._bad


def test_an_endpoint_two_producers_relay_from_keeps_its_reports_until_both_are_forgotten(
    tmp_path,
):
    out, _ = fanout(tmp_path)
    relay_of(out, "r", "tcp://10.0.0.3:6000")
    relay_of(out, "r2", "tcp://10.0.0.3:6000")  # restarted under another id, same address
    out.done(done("p", ("tcp://10.0.0.3:6000", "stalled")))
    out.forget("r")
    assert dict(out._bad) == {"tcp://10.0.0.3:6000": 1}
    out.forget("r2")
    assert not out._bad
