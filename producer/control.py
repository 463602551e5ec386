"""The producer's control channel to the consumer: requests and their replies.

`ControlClient` owns the DEALER. Requests carry `req` ids; one reader task matches replies to
waiting futures, so several coroutines may have requests in flight. A request without a reply
in `timeout_s` raises `TimeoutError` (the consumer may be restarting; DEALER reconnects by
itself and the caller retries). A `Reject` reply raises `Rejected(reason)`. A monitor task
(`watch_link`) follows the connection's events: `link` says what it has seen (nothing
listening, connected, a failing security handshake) for "waiting for the consumer" lines,
and counts connections made (`connects`; `on_connected` is told: a consumer restarted at the
same address is heard of at once), and a key the consumer's authenticator refuses fails every
request with `KeyRefused` at once;
so does a consumer that answers in another wire schema (`SchemaMismatch`: another release).
A status the consumer pushes unasked (req 0: room for held groups) goes to `on_pushed`, and so
does the status of a reply that comes after its request timed out: the consumer hands acks and
the end of the run over in a status once, so none is dropped unapplied.

The producer's other sockets: the group sender (producer/outbox.py), snapshot announcements
(producer/announcements.py), snapshot chunks (producer/fetch/chunk_client.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from common import wire
from common.errors import ConfigError, WireError
from common.net.keys import Keys
from common.net.log_limit import LogLimiter
from common.net.sockets import client_socket

log = logging.getLogger("asyncgrpo.producer")
_NO_DETAIL = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
_WITH_STATUS = (wire.StatusReply, wire.LeaseGrant, wire.Welcome)


class KeyRefused(ConfigError):
    """The consumer's authenticator refused this producer's CurveZMQ key (ZAP status 400)."""


class SchemaMismatch(ConfigError):
    """The consumer answers in another wire schema version: it runs another release."""


class Rejected(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"consumer rejected the request: {reason} {detail}".strip())
        self.reason = reason


class ControlClient:
    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        *,
        keys: Keys | None,
        max_message_bytes: int,
        max_in_flight: int = wire.MAX_LEASES_PER_GRANT,
    ) -> None:
        self.sock = client_socket(
            ctx, zmq.DEALER, endpoint, keys=keys, max_message_bytes=max_message_bytes
        )
        # grants of up to `max_in_flight` leases and statuses of every ack decode (wire.sizes)
        self.limits = wire.reply_limits(max_message_bytes, max_in_flight)
        self._next = 1
        self._waiting: dict[int, asyncio.Future[wire.Message]] = {}
        self.num_bad_replies = 0
        self.last_reply_s = time.monotonic()  # when the consumer last answered anything
        self._log = LogLimiter(log)
        self.endpoint, self.keys = endpoint, keys
        self.link = "nothing listens there yet"  # what the connection has seen, for the operator
        self.handshake_failed = False  # the last connection's security handshake failed
        self.refused: ConfigError | None = None  # KeyRefused or SchemaMismatch: final
        self._monitor = self.sock.get_monitor_socket()
        self.on_pushed: Callable[[wire.Status], None] | None = None
        self.connects = 0  # connections made to the consumer (a reconnection: it may be new)
        self.on_connected: Callable[[], None] | None = None

    async def request(self, msg: wire.Message, *, timeout_s: float) -> wire.Message:
        """Send `msg` (its `req` field is replaced) and await the matching reply. Raises
        `KeyRefused` at once when the consumer has refused our key, `SchemaMismatch` when it
        speaks another wire schema."""
        if self.refused is not None:
            raise self.refused
        req = self._next
        self._next += 1
        msg = dataclasses.replace(msg, req=req)  # type: ignore[arg-type]
        fut: asyncio.Future[wire.Message] = asyncio.get_running_loop().create_future()
        self._waiting[req] = fut
        try:
            async with asyncio.timeout(timeout_s):  # send too: a DEALER with no peer blocks
                await self.sock.send(wire.encode(msg))
                reply = await fut
        finally:
            self._waiting.pop(req, None)
        if isinstance(reply, wire.Reject):
            raise Rejected(reply.reason, reply.detail)
        return reply

    async def read_replies(self) -> None:
        """The reader task: runs until cancelled."""
        while True:
            data = await self.sock.recv()
            try:
                reply = wire.decode(data, self.limits)
            except WireError as exc:
                self.num_bad_replies += 1
                if exc.reason == "schema_version":
                    self._fail(
                        SchemaMismatch(
                            f"the consumer at {self.endpoint} speaks another wire schema "
                            f"({exc.detail})"
                        )
                    )
                self._log.log(exc.reason, logging.WARNING, "bad reply from the consumer: %s", exc)
                continue
            self.last_reply_s = time.monotonic()
            req = getattr(reply, "req", 0)
            fut = self._waiting.get(req)
            if fut is not None and not fut.done():
                fut.set_result(reply)
            elif isinstance(reply, _WITH_STATUS) and self.on_pushed is not None:
                self.on_pushed(reply.status)  # pushed unasked (req 0), or came too late
            elif isinstance(reply, wire.Reject) and req == 0:
                # The consumer could not parse a request well enough to know its id.
                log.warning("consumer rejected a request: %s %s", reply.reason, reply.detail)

    async def watch_link(self) -> None:
        """The monitor task (runs until cancelled): follows the connection's events, so that a
        refused key is told apart from a consumer that is down. On a refusal every waiting
        request fails with `KeyRefused` (and every later one at once)."""
        from zmq.utils.monitor import parse_monitor_message

        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            kind = event["event"]
            if kind == zmq.EVENT_CONNECTED:
                self.link = "connected; no CurveZMQ handshake yet" if self.keys else "connected"
                self.handshake_failed = False
                self.connects += 1
                if self.on_connected is not None:
                    self.on_connected()
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.link = "connected, no answer yet"
            elif kind in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, _NO_DETAIL):
                self.handshake_failed = True
                self.link = (
                    "connected, but the security handshake fails: does the consumer use keys "
                    "(--keys) exactly when this producer does, and is server.key the consumer's?"
                )
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._refuse(int(event["value"]))

    def _refuse(self, status: int) -> None:
        public = self.keys.public.decode() if self.keys else ""
        where = f"{self.keys.directory}/client.key" if self.keys else "no key"
        self._fail(
            KeyRefused(
                f"the consumer at {self.endpoint} refused this producer's CurveZMQ key "
                f"({where}, public key {public[:8]}..., ZAP status {status}): it is not in the "
                "consumer's allowlist (keys/clients/NAME.key, from `asyncgrpo keys DIR --producer "
                "NAME`), or was revoked"
            )
        )

    def _fail(self, error: ConfigError) -> None:
        """Fail every waiting request, and every later one, with `error`."""
        self.refused = error
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(error)

    def close(self) -> None:
        self.sock.disable_monitor()
        self._monitor.close(linger=0)
        self.sock.close(linger=0)


def waits_line(follow: bool, wait_s: float) -> str:
    """How long a producer waits for its consumer's welcome, for the log."""
    if not follow:
        return f"gives up after net.handshake_timeout_s = {wait_s:g} s"
    if wait_s == float("inf"):
        return "producer.follow: waits for ever, by design"
    return f"producer.follow: waits up to net.consumer_timeout_s = {wait_s:g} s"
