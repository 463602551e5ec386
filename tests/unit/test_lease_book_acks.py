"""LeaseBook paths a sampled mutation run found untested: acks put back after a reply that could
not be sent (`requeue_acks`), `holds`, and `totals` (consumer/server/leases.py)."""

from __future__ import annotations

from common.wire import Ack
from consumer.data.prompts import PromptOrder
from consumer.server.leases import MAX_ACKS, LeaseBook


def book() -> LeaseBook:
    return LeaseBook(
        PromptOrder(100, seed=0, shuffle=False, epochs=0), prompts_per_step=4, max_staleness=0
    )


def acked(b: LeaseBook, producer: str, lease_ids: range) -> None:
    for lease_id in lease_ids:  # leases never issued: each is acked as expired
        assert b.receive(lease_id, producer) == "unknown"


def test_acks_taken_for_an_unsent_reply_go_back_first_in_their_order():
    b = book()
    acked(b, "p", range(1000, 1010))
    acked(b, "q", range(2000, 2002))
    taken = b.take_acks("p", limit=4)
    b.requeue_acks("p", taken)
    assert b.take_acks("p") == taken + tuple(Ack(i, "expired") for i in range(1004, 1010))
    assert [a.lease_id for a in b.take_acks("q")] == [2000, 2001]  # another queue: untouched


def test_acks_requeued_after_their_queue_was_emptied_are_not_lost():
    b = book()
    acked(b, "p", range(3))
    taken = b.take_acks("p")  # the whole queue: it is removed
    assert "p" not in b.acks
    b.requeue_acks("p", taken)
    assert b.take_acks("p") == taken
    assert b.take_acks("p") == ()


def test_requeued_acks_beyond_the_bound_push_out_the_newest():
    b = book()
    acked(b, "p", range(MAX_ACKS))
    taken = b.take_acks("p", limit=2)
    acked(b, "p", range(MAX_ACKS, MAX_ACKS + 2))  # the queue is full again
    b.requeue_acks("p", taken)
    assert b.acks_dropped == 2
    queue = b.acks["p"]
    assert len(queue) == MAX_ACKS
    assert (queue[0].lease_id, queue[1].lease_id) == (0, 1)
    assert queue[-1].lease_id == MAX_ACKS - 1


def test_holds_is_true_exactly_while_a_producer_holds_an_open_lease():
    b = book()
    (rec,) = b.grant("a", 1, policy_version=0, published_version=0, now=0.0)
    assert b.holds("a") is True
    assert b.holds("b") is False
    b.finalize(rec.lease_id, "expired")
    assert b.holds("a") is False


def test_totals_count_every_state_and_the_open_leases():
    b = book()
    recs = b.grant("a", 4, policy_version=0, published_version=0, now=0.0)
    for rec, outcome in zip(recs[:3], ("trained", "dropped_zero_variance", "expired"), strict=True):
        if outcome != "expired":
            assert b.receive(rec.lease_id, "a") == "accept"
        b.finalize(rec.lease_id, outcome)
    t = b.totals()
    assert (t.issued, t.trained, t.dropped_zero_variance, t.expired, t.open) == (4, 1, 1, 1, 1)
    assert (t.dropped_stale, t.rejected_invalid) == (0, 0)
    assert t.ok is None


def test_taking_from_an_empty_queue_drops_it():
    """A producer whose queue is empty keeps no entry (one per producer ever seen would grow)."""
    b = book()
    b.requeue_acks("p", ())  # leaves an empty queue behind
    assert "p" in b.acks
    assert b.take_acks("p") == ()
    assert "p" not in b.acks
    assert b.take_acks("never-seen") == ()
    assert "never-seen" not in b.acks


def test_a_held_lease_expires_when_its_producer_is_gone_and_not_while_it_lives():
    b = book()
    (rec,) = b.grant("a", 1, policy_version=0, published_version=0, now=0.0)
    assert b.receive(rec.lease_id, "a") == "accept"
    b.hold(rec.lease_id)  # its group waits for room at the consumer
    b.hold(rec.lease_id)  # told again (a re-sent group): still held, told once more
    assert b.take_acks("a") == (Ack(rec.lease_id, "hold"), Ack(rec.lease_id, "hold"))
    assert b.expire(now=1e9, lease_timeout_s=1.0, gone=set()) == []  # held: never late
    (gone,) = b.expire(now=1e9, lease_timeout_s=1.0, gone={"a"})
    assert (gone.lease_id, b.final_states[rec.lease_id]) == (rec.lease_id, "expired")
