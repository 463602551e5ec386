"""The ledger invariant, checkable from any test: every lease issued is final or still open.

    per producer p:  issued[p] + taken_over[p] - handed_over[p] == Σ_o final[p][o] + open[p]
    in total:        issued == Σ_o final[o] + open            (o over the outcomes)

`taken_over` / `handed_over` count leases whose group another producer delivered (the lease moves
to it); both are zero in an honest run. `assert_book_balanced` checks a live `LeaseBook` from its
own counts and open leases; `assert_run_balanced` checks a finished run's `ledger.json` against the
lease records of `leases.jsonl`, so a count that is lost, negated or zeroed on both the saving and
the resuming side is still caught.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from common.files import run_files as RF
from common.wire import OUTCOMES
from consumer.server.leases import LeaseBook


def assert_balanced(
    totals: Mapping[str, int],
    by_producer: Mapping[str, Mapping[str, int]],
    open_by_producer: Mapping[str, int],
) -> None:
    """`totals`: "issued" and one count per outcome; `by_producer[p]`: the same for producer p
    (missing keys count 0); `open_by_producer[p]`: leases of p not yet final."""
    num_open = sum(open_by_producer.values())
    finals = sum(totals.get(o, 0) for o in OUTCOMES)
    assert totals["issued"] == finals + num_open, (dict(totals), num_open)
    assert set(open_by_producer) <= set(by_producer), "open leases of an unknown producer"
    for p, c in by_producer.items():
        assert all(v >= 0 for v in c.values()), (p, dict(c))
        held = c.get("issued", 0) + c.get("taken_over", 0) - c.get("handed_over", 0)
        final = sum(c.get(o, 0) for o in OUTCOMES)
        assert held == final + open_by_producer.get(p, 0), (p, dict(c), open_by_producer.get(p))
    for key in ("issued", *OUTCOMES):  # the per-producer counts add up to the totals
        assert sum(c.get(key, 0) for c in by_producer.values()) == totals.get(key, 0), key
    moved = [sum(c.get(k, 0) for c in by_producer.values()) for k in ("taken_over", "handed_over")]
    assert moved[0] == moved[1], moved


def assert_book_balanced(book: LeaseBook) -> None:
    """The invariant of a live lease book, and its own `balance()` agreeing."""
    open_by_producer = Counter(r.producer_id for r in book.open.values())
    assert_balanced(book.counts, book.by_producer, open_by_producer)
    assert book.balance().ok
    assert book.balance().open == len(book.open)


def assert_run_balanced(run_dir: Path) -> RF.Ledger:
    """A finished run: `ledger.json` balances, no lease is left open, and its counts (in total and
    per producer) equal those of the final lease records in `leases.jsonl`. Returns the ledger."""
    ledger = RF.read_ledger(run_dir)
    records = RF.read_leases(run_dir)
    balance = ledger.balance
    assert balance.ok, balance
    assert balance.open == 0, balance
    assert_balanced(balance.to_json(), ledger.by_producer, {})
    assert balance.issued == len(records)
    assert Counter(r.state for r in records) == Counter(
        {o: balance.final(o) for o in OUTCOMES if balance.final(o)}
    )
    recorded = Counter((r.producer_id, r.state) for r in records)
    held = Counter(r.producer_id for r in records)
    for p in ledger.by_producer:
        assert {o: ledger.count(p, o) for o in OUTCOMES} == {o: recorded[p, o] for o in OUTCOMES}
        assert ledger.held(p) == held[p], p
    assert set(held) <= set(ledger.by_producer)
    return ledger
