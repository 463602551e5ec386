"""The fetcher's end of a data socket: chunk requests to the consumer's data socket or a relay.

`ChunkClient` owns one DEALER connected to one source (consumer/snapshots/dataplane.py or
producer/fetch/relay.py). `chunk(msg)` sends a `wire.FileChunkRequest` and awaits its reply; several
may be in flight, matched by `req` id. The reply's bytes are the received ZeroMQ frame itself
(`copy=False`: a read-only view, never copied by this client); decoding is bounded
(`wire.decode_reply`). A reply that does not decode is counted (`num_bad_replies`) and dropped,
so its request times out; a `Reject` raises `Rejected`; no reply in `timeout_s` raises
`TimeoutError`. With `idle_s`, a request may wait longer than `idle_s` as long as the source
shows it is alive: a relay still fetching holds a request until its chunk arrives, which may
take several chunk times, or longer while its own source fails and it turns to the next. Once
nothing at all came from the source for `idle_s`, the client sends a probe (a request for no
bytes, which every source answers at once); if nothing comes for another `idle_s`, the request
raises `TimeoutError`. So a relay that died is dropped after 2 * `idle_s`, and one that waits
on a dead source of its own is not dropped with it. What to do about either (drop a relay, give
up) is the fetcher's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

import zmq
import zmq.asyncio

from common import wire
from common.errors import WireError
from common.net.keys import Keys
from common.net.log_limit import LogLimiter
from common.net.sockets import client_socket
from producer.control import Rejected

log = logging.getLogger("asyncgrpo.producer")


class ChunkClient:
    def __init__(
        self, ctx: zmq.asyncio.Context, endpoint: str, *, keys: Keys | None, max_message_bytes: int
    ) -> None:
        self.endpoint = endpoint
        self.sock = client_socket(
            ctx, zmq.DEALER, endpoint, keys=keys, max_message_bytes=max_message_bytes
        )
        self.limits = wire.Limits(max_message_bytes=max_message_bytes)
        self._next = 1
        self._waiting: dict[int, asyncio.Future[wire.Chunk]] = {}
        self.num_bad_replies = 0
        self._log = LogLimiter(log)
        self._reader: asyncio.Task[None] | None = None
        self._heard = time.monotonic()  # the last reply, or when waiting began (monotonic s)
        self._probed = float("-inf")  # the last probe sent (monotonic s)

    async def chunk(
        self, msg: wire.FileChunkRequest, *, timeout_s: float, idle_s: float | None = None
    ) -> wire.Chunk:
        """Send `msg` (its `req` is replaced) and await its chunk. Raises `Rejected` or
        `TimeoutError` (see the module doc)."""
        if self._reader is None:
            self._reader = asyncio.ensure_future(self._read())
        req = self._next
        self._next += 1
        fut: asyncio.Future[wire.Chunk] = asyncio.get_running_loop().create_future()
        if not self._waiting:
            self._heard = time.monotonic()  # nothing was awaited: the source was not silent
        self._waiting[req] = fut
        try:
            async with asyncio.timeout(timeout_s):  # send too: a DEALER with no peer blocks
                await self.sock.send(wire.encode(dataclasses.replace(msg, req=req)))
                if idle_s is None:
                    return await fut
                return await self._while_alive(fut, msg, idle_s)
        finally:
            self._waiting.pop(req, None)

    async def _while_alive(
        self, fut: asyncio.Future[wire.Chunk], msg: wire.FileChunkRequest, idle_s: float
    ) -> wire.Chunk:
        """`fut`'s chunk, unless the source stays silent for `idle_s` and then does not answer
        a probe within `idle_s` (`TimeoutError`)."""
        while True:
            now = time.monotonic()
            left = self._heard + idle_s - now
            if left <= 0:  # silent: is it alive?
                if self._probed <= self._heard:  # not asked since it last spoke
                    self._probed = now
                    probe = wire.FileChunkRequest(
                        req=self._next, version=msg.version, file=msg.file, offset=0, max_bytes=0
                    )
                    self._next += 1  # its reply finds no request: only `_heard` notes it
                    await self.sock.send(wire.encode(probe))
                left = self._probed + idle_s - now
                if left <= 0:
                    raise TimeoutError(f"{self.endpoint}: silent for {idle_s} s, and to a probe")
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(fut), left)

    async def _read(self) -> None:
        while True:
            frames = await self.sock.recv_multipart(copy=False)
            self._heard = time.monotonic()
            try:
                reply = wire.decode_reply([f.buffer for f in frames], self.limits)
            except WireError as exc:
                self.num_bad_replies += 1
                self._log.log(
                    exc.reason, logging.WARNING, "bad reply from %s: %s", self.endpoint, exc
                )
                continue
            fut = self._waiting.get(getattr(reply, "req", 0))
            if fut is None or fut.done():
                continue  # a reply to a request that timed out: dropped
            if isinstance(reply, wire.Chunk):
                fut.set_result(reply)
            elif isinstance(reply, wire.Reject):
                fut.set_exception(Rejected(reply.reason, reply.detail))
            else:
                fut.set_exception(Rejected("unexpected_kind", type(reply).__name__))

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        self.sock.close(linger=0)
