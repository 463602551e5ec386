"""Peers of another wire schema (another release) are refused with a message that says so.

A producer whose consumer answers in another schema fails its request at once with
`SchemaMismatch` (a `ConfigError`: the producer exits naming both versions), and every later
request too, rather than waiting out its handshake timeout; the consumer side (a group or a
request of an older producer, refused and counted as `schema_version`) is covered by
tests/integration/test_hostile_input.py.
"""

from __future__ import annotations

import asyncio

import msgpack
import pytest
import zmq
import zmq.asyncio

from common import wire
from common.errors import ConfigError
from producer.control import ControlClient, SchemaMismatch

REGISTER = wire.Register(0, "p0", "h", 1, "fake", -1)


async def _old_consumer(router: zmq.asyncio.Socket) -> None:
    """Answer every request with a status reply in the previous schema, as the previous release
    does."""
    status = wire.StatusReply(0, wire.Status("r", 0, None))
    while True:
        identity, payload = await router.recv_multipart()
        body = msgpack.unpackb(wire.encode(status), raw=False)
        body["schema"] = wire.SCHEMA_VERSION - 1
        body["req"] = msgpack.unpackb(payload, raw=False)["req"]
        await router.send_multipart([identity, msgpack.packb(body, use_bin_type=True)])


async def test_a_consumer_of_another_schema_fails_the_producers_requests_naming_both():
    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = ControlClient(ctx, f"tcp://127.0.0.1:{port}", keys=None, max_message_bytes=1 << 20)
    tasks = [asyncio.create_task(client.read_replies()), asyncio.create_task(_old_consumer(router))]
    try:
        async with asyncio.timeout(30):
            with pytest.raises(
                SchemaMismatch,
                match=f"got {wire.SCHEMA_VERSION - 1}, this build speaks {wire.SCHEMA_VERSION}",
            ) as info:
                await client.request(REGISTER, timeout_s=20)
            assert isinstance(info.value, ConfigError)
            assert "run the same one on the consumer and every producer" in str(info.value)
            with pytest.raises(SchemaMismatch):  # at once: no second round trip
                await client.request(REGISTER, timeout_s=0.001)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        client.close()
        router.close(linger=0)
        ctx.destroy(linger=0)
