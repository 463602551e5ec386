"""Backpressure's pieces without sockets: the consumer's bounded queue
(consumer/server/admission.py), held leases in the lease book, and the producer's outbox obeying
`hold` / `send`."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from common import wire
from consumer.data.prompts import PromptOrder
from consumer.server.admission import Admission
from consumer.server.leases import LeaseBook
from producer.outbox import Outbox
from tests.ledger_invariant import assert_book_balanced
from tests.unit.test_wire import group


def test_the_queue_never_exceeds_its_bytes_and_the_held_go_first_when_room_comes():
    adm = Admission(max_bytes=250, max_groups=10)
    assert adm.offer(group(lease_id=1), 100, now=0.0)
    assert adm.offer(group(lease_id=2), 100, now=0.0)
    assert not adm.offer(group(lease_id=3, producer_id="p1"), 100, now=1.0)  # 300 > 250
    assert not adm.offer(group(lease_id=4), 10, now=2.0)  # fits, but 3 waits before it
    assert adm.queued_bytes == 200
    assert adm.release() == []  # no room yet
    got = adm.get(timeout_s=0)
    assert got is not None
    assert got.lease_id == 1
    assert adm.release() == [("p1", 3), ("p0", 4)]  # oldest first; room reserved for both
    assert not adm.offer(group(lease_id=5), 50, now=3.0)  # 100 + 110 reserved + 50 > 250
    assert adm.offer(group(lease_id=3, producer_id="p1"), 100, now=4.0)  # on its reservation
    assert adm.offer(group(lease_id=4), 10, now=4.0)
    assert adm.queued_bytes == 210
    summary = adm.summary()
    assert summary.queued_bytes_peak == 210
    assert summary.queued_bytes_peak <= 250
    assert summary.holds == 3
    assert summary.groups_held == 1  # lease 5
    assert summary.hold_s_max == pytest.approx(3.0)  # lease 3: told at 1.0, admitted at 4.0
    assert summary.hold_s_mean == pytest.approx(2.5)


def test_the_count_bound_holds_too_and_an_ended_lease_gives_its_room_back():
    adm = Admission(max_bytes=1 << 20, max_groups=1)
    assert adm.offer(group(lease_id=1), 10, now=0.0)
    assert not adm.offer(group(lease_id=2), 10, now=0.0)
    assert adm.get(timeout_s=0) is not None
    assert adm.release() == [("p0", 2)]
    assert not adm.offer(group(lease_id=3), 10, now=0.0)  # the room is lease 2's
    adm.prune(open_leases={3})  # lease 2 expired with its producer
    assert adm.release() == [("p0", 3)]
    assert adm.summary().groups_held == 1  # 3, reserved


def test_a_released_group_that_grew_waits_again_at_the_head():
    adm = Admission(max_bytes=100, max_groups=10)
    assert adm.offer(group(lease_id=1), 60, now=0.0)
    assert not adm.offer(group(lease_id=2), 50, now=0.0)
    assert not adm.offer(group(lease_id=3), 10, now=0.0)
    assert adm.get(timeout_s=0) is not None
    assert adm.release() == [("p0", 2), ("p0", 3)]
    assert not adm.offer(group(lease_id=16), 45, now=0.0)  # 60 of 100 are reserved
    assert not adm.offer(group(lease_id=2), 95, now=0.0)  # not what was announced: held again
    assert adm.offer(group(lease_id=3), 10, now=0.0)
    assert adm.queued_bytes <= 100


def test_a_held_lease_never_times_out_and_expires_only_with_its_producer():
    order = PromptOrder(10, seed=0, shuffle=False, epochs=0)
    book = LeaseBook(order, prompts_per_step=4, max_staleness=1)
    a, b = book.grant("p", 2, policy_version=0, published_version=0, now=0.0)
    for rec in (a, b):
        assert book.receive(rec.lease_id, "p") == "accept"
        book.hold(rec.lease_id)
    assert book.take_acks("p") == (wire.Ack(a.lease_id, wire.HOLD), wire.Ack(b.lease_id, wire.HOLD))
    assert book.expire(now=1e9, lease_timeout_s=1.0, gone=set()) == []  # waiting, not late
    book.release(a.lease_id)
    assert book.take_acks("p") == (wire.Ack(a.lease_id, wire.SEND),)
    assert book.receive(a.lease_id, "p") == "accept"  # the re-sent group
    book.finalize(a.lease_id, "trained")
    assert [r.lease_id for r in book.expire(now=0.0, lease_timeout_s=1e9, gone={"p"})] == [
        b.lease_id
    ]
    assert_book_balanced(book)


async def test_the_outbox_keeps_a_held_group_unsent_until_told_and_counts_it():
    ctx = zmq.asyncio.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    try:
        async with asyncio.timeout(10):
            outbox = Outbox(push, resend_after_s=60.0)
            await outbox.send(group(lease_id=5))
            assert wire.decode(await pull.recv()).lease_id == 5  # type: ignore[union-attr]
            outbox.acknowledge((wire.Ack(5, wire.HOLD),))
            assert (outbox.num_held, outbox.num_told_hold) == (1, 1)
            assert await outbox.resend() == 0  # held: not re-sent on the timer
            outbox.acknowledge((wire.Ack(5, wire.SEND),))
            assert (outbox.num_held, outbox.num_released) == (0, 1)
            assert await outbox.resend() == 1
            assert wire.decode(await pull.recv()).lease_id == 5  # type: ignore[union-attr]
            assert outbox.num_released == 0
            assert 5 in outbox.pending  # until its final outcome
            outbox.acknowledge((wire.Ack(5, "trained"),))
            assert not outbox.pending
            assert outbox.outcomes == {"trained": 1}
    finally:
        for sock in (pull, push):
            sock.close(linger=0)
        ctx.term()
