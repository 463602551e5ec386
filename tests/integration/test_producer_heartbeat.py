"""The producer keeps the heartbeat rule (common/net/heartbeat.py): it beats at the period the
consumer last sent, not its own net.heartbeat_s, and the silences it tolerates (the consumer's,
an unacknowledged group's) stretch with that period. A real producer against a scripted
consumer (a ROUTER on loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio
from served import fake_session

from common import config as C
from common import wire
from producer.worker import ConsumerLost, Producer


@contextlib.asynccontextmanager
async def producer_and_consumer(*sets: str) -> AsyncIterator[tuple[Producer, zmq.asyncio.Socket]]:
    """A producer (own period 600 s) whose control socket reaches a ROUTER the test answers."""
    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    cfg = C.apply_overrides(
        C.Config(),
        [f"net.connect=tcp://127.0.0.1:{port}", "net.heartbeat_s=600",
         "net.producer_timeout_s=1300", *sets],
    )  # fmt: skip
    producer = Producer(cfg, ctx)
    reader = asyncio.create_task(producer.control.read_replies())
    try:
        yield producer, router
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        producer.control.close()
        producer.weights.close()
        router.close(linger=0)
        ctx.destroy(linger=0)


def status(heartbeat_s: float) -> wire.Status:
    return wire.Status("run", 0, None, heartbeat_s=heartbeat_s)


async def test_a_producer_beats_at_the_period_the_consumer_sent_not_its_own() -> None:
    async with producer_and_consumer("net.consumer_timeout_s=0") as (producer, router):
        beating = asyncio.create_task(producer.heartbeat_loop())
        try:
            async with asyncio.timeout(30):  # its own period (600 s) would end here, failed
                for _ in range(3):
                    identity, data = await router.recv_multipart()
                    beat = wire.decode(data, wire.Limits())
                    assert isinstance(beat, wire.Heartbeat)
                    reply = wire.StatusReply(beat.req, status(heartbeat_s=0.05))
                    await router.send_multipart([identity, wire.encode(reply)])
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
        assert producer.state.heartbeat_s == 0.05


async def test_the_consumer_timeout_stretches_with_the_period_it_sent() -> None:
    async with producer_and_consumer("net.consumer_timeout_s=10") as (producer, _):
        producer._on_status(status(heartbeat_s=16.0))  # silences of 3 x 16 s tolerated
        producer.control.last_reply_s = time.monotonic() - 45.0
        producer.check_consumer()  # 45 s > net.consumer_timeout_s, yet not lost
        producer.control.last_reply_s = time.monotonic() - 50.0
        with pytest.raises(ConsumerLost, match=r"net\.consumer_timeout_s = 10"):
            producer.check_consumer()


async def test_an_unacknowledged_group_waits_longer_before_it_is_resent_at_a_long_period() -> None:
    async with producer_and_consumer("net.resend_after_s=60") as (producer, _):
        producer.session = fake_session(producer)
        outbox = producer.session.outbox
        try:
            producer._on_status(status(heartbeat_s=1.0))
            assert outbox.resend_after_s == 60.0  # acks come within a period: unchanged
            producer._on_status(status(heartbeat_s=40.0))
            assert outbox.resend_after_s == 3 * 40.0  # an ack may take a period to come
        finally:
            outbox.sock.close(linger=0)
