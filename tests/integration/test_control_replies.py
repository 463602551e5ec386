"""producer/control.py hands over the status of every reply nobody waits for: a status the
consumer pushes unasked, and one that comes after its request timed out (real sockets on
loopback, a scripted consumer). A status carries acks and the end of the run once: dropping a
late one lost them."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from common import wire
from producer.control import ControlClient


def status(*acks: int, finished: bool = False) -> wire.Status:
    return wire.Status("run-1", 3, None, tuple(wire.Ack(i, "trained") for i in acks), finished)


async def test_a_reply_that_comes_after_its_request_timed_out_is_applied_as_pushed():
    ctx = zmq.asyncio.Context()
    consumer = ctx.socket(zmq.ROUTER)
    port = consumer.bind_to_random_port("tcp://127.0.0.1")
    client = ControlClient(ctx, f"tcp://127.0.0.1:{port}", keys=None, max_message_bytes=1 << 20)
    seen: asyncio.Queue[wire.Status] = asyncio.Queue()
    client.on_pushed = seen.put_nowait
    reader = asyncio.create_task(client.read_replies())
    try:
        ask = asyncio.create_task(
            client.request(wire.Heartbeat(0, "p", 0, "ready", 0, {}), timeout_s=0.5)
        )
        identity, data = await asyncio.wait_for(consumer.recv_multipart(), 10)
        request = wire.decode(data)
        with pytest.raises(TimeoutError):
            await ask  # the consumer answers only after the producer gave up
        late = status(7, 8, finished=True)
        await consumer.send_multipart([identity, wire.encode(wire.StatusReply(request.req, late))])
        assert await asyncio.wait_for(seen.get(), 10) == late
        grant = wire.LeaseGrant(99, (), status(9))  # a late grant's status too
        await consumer.send_multipart([identity, wire.encode(grant)])
        assert await asyncio.wait_for(seen.get(), 10) == grant.status
        pushed = status(10)
        await consumer.send_multipart([identity, wire.encode(wire.StatusReply(0, pushed))])
        assert await asyncio.wait_for(seen.get(), 10) == pushed
    finally:
        reader.cancel()
        client.close()
        consumer.close(linger=0)
        ctx.destroy(linger=0)
