"""The producer's end of the sockets: control requests, the group sender, announcements
(snapshot chunks: producer/chunk_client.py).

- `ControlClient` owns the DEALER. Requests carry `req` ids; one reader task matches replies to
  waiting futures, so several coroutines may have requests in flight. A request without a reply
  in `timeout_s` raises `TimeoutError` (the consumer may be restarting; DEALER reconnects by
  itself and the caller retries). A `Reject` reply raises `Rejected(reason)`. A monitor task
  (`watch_link`) follows the connection's events: `link` says what it has seen (nothing
  listening, connected, a failing security handshake) for "waiting for the consumer" lines,
  and a key the consumer's authenticator refuses fails every request with `KeyRefused` at once.
  A status the consumer pushes unasked (req 0: room for held groups) goes to `on_pushed`.
- `Outbox` owns the PUSH socket and every finished group until the consumer acknowledges it:
  at-least-once delivery. A group is re-sent when the consumer restarted (new run id) or when no
  ack came within `resend_after_s`; the consumer's ledger makes duplicates harmless. A group the
  consumer had no room for (ack `hold`: backpressure, consumer/admission.py) is held here, not
  re-sent, until the consumer says `send` (or, should that word be lost, `resend_after_s`
  later); held groups count against the producer's leases (`num_held`), so a full consumer
  stops new generation instead of filling memory anywhere.
- `announcements` yields `Announce` messages from the SUB socket (hints: a missed one only costs
  latency, because every control reply carries the newest snapshot too).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from common import wire
from common.errors import ConfigError, WireError
from common.keys import Keys
from common.log_limit import LogLimiter
from common.sockets import client_socket

log = logging.getLogger("asyncgrpo.producer")
_NO_DETAIL = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


class KeyRefused(ConfigError):
    """The consumer's authenticator refused this producer's CurveZMQ key (ZAP status 400)."""


class Rejected(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"consumer rejected the request: {reason} {detail}".strip())
        self.reason = reason


class ControlClient:
    def __init__(
        self, ctx: zmq.asyncio.Context, endpoint: str, *, keys: Keys | None, max_message_bytes: int
    ) -> None:
        self.sock = client_socket(
            ctx, zmq.DEALER, endpoint, keys=keys, max_message_bytes=max_message_bytes
        )
        self.limits = wire.Limits(max_message_bytes=max_message_bytes)
        self._next = 1
        self._waiting: dict[int, asyncio.Future[wire.Message]] = {}
        self.num_bad_replies = 0
        self.last_reply_s = time.monotonic()  # when the consumer last answered anything
        self._log = LogLimiter(log)
        self.endpoint, self.keys = endpoint, keys
        self.link = "nothing listens there yet"  # what the connection has seen, for the operator
        self.refused: KeyRefused | None = None
        self._monitor = self.sock.get_monitor_socket()
        self.on_pushed: Callable[[wire.Status], None] | None = None

    async def request(self, msg: wire.Message, *, timeout_s: float) -> wire.Message:
        """Send `msg` (its `req` field is replaced) and await the matching reply. Raises
        `KeyRefused` at once when the consumer has refused our key."""
        if self.refused is not None:
            raise self.refused
        req = self._next
        self._next += 1
        msg = dataclasses.replace(msg, req=req)  # type: ignore[call-arg]
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
                self._log.log(exc.reason, logging.WARNING, "bad reply from the consumer: %s", exc)
                continue
            self.last_reply_s = time.monotonic()
            req = getattr(reply, "req", 0)
            fut = self._waiting.get(req)
            if fut is not None and not fut.done():
                fut.set_result(reply)
            elif req == 0 and isinstance(reply, wire.StatusReply) and self.on_pushed is not None:
                self.on_pushed(reply.status)
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
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.link = "connected, no answer yet"
            elif kind in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, _NO_DETAIL):
                self.link = (
                    "connected, but the security handshake fails: does the consumer use keys "
                    "(--keys) exactly when this producer does, and is server.key the consumer's?"
                )
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._refuse(int(event["value"]))

    def _refuse(self, status: int) -> None:
        public = self.keys.public.decode() if self.keys else ""
        where = f"{self.keys.directory}/client.key" if self.keys else "no key"
        self.refused = KeyRefused(
            f"the consumer at {self.endpoint} refused this producer's CurveZMQ key "
            f"({where}, public key {public[:8]}..., ZAP status {status}): it is not in the "
            "consumer's allowlist (keys/clients/NAME.key, from `asyncgrpo keys DIR --producer "
            "NAME`), or was revoked"
        )
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(self.refused)

    def close(self) -> None:
        self.sock.disable_monitor()
        self._monitor.close(linger=0)
        self.sock.close(linger=0)


@dataclass
class _Pending:
    data: bytes
    sent_at: float
    held_since: float = 0.0  # monotonic seconds it was first told to hold; 0 = not held
    release: bool = False  # told to send it again


class Outbox:
    """Finished groups, kept until acknowledged; the only writer of the PUSH socket."""

    def __init__(self, sock: zmq.asyncio.Socket, *, resend_after_s: float) -> None:
        self.sock = sock
        self.resend_after_s = resend_after_s
        self.pending: dict[int, _Pending] = {}
        self.num_sent = self.num_resent = 0
        self.num_told_hold = 0  # `hold` acks received
        self.hold_s = 0.0  # seconds groups spent held, summed when they are sent again
        self.outcomes: dict[str, int] = {}

    @property
    def num_held(self) -> int:
        """Groups the consumer told us to hold and we have not sent again yet."""
        return sum(1 for item in self.pending.values() if item.held_since and not item.release)

    @property
    def num_released(self) -> int:
        """Held groups the consumer has room for: `resend` sends them."""
        return sum(1 for item in self.pending.values() if item.release)

    async def send(self, group: wire.Group) -> None:
        data = wire.encode(group)
        self.pending[group.lease_id] = _Pending(data, time.monotonic())
        await self.sock.send(data)
        self.num_sent += 1

    def acknowledge(self, acks: tuple[wire.Ack, ...]) -> None:
        """Apply the consumer's acks: a final outcome forgets the group, `hold` keeps it
        unsent, `send` marks it for `resend`."""
        now = time.monotonic()
        for ack in acks:
            if ack.outcome == wire.HOLD:
                if (item := self.pending.get(ack.lease_id)) is not None:
                    self.num_told_hold += 1
                    item.held_since = item.held_since or now
                    item.release = False
            elif ack.outcome == wire.SEND:
                if (item := self.pending.get(ack.lease_id)) is not None:
                    item.release = True
            elif self.pending.pop(ack.lease_id, None) is not None:
                self.outcomes[ack.outcome] = self.outcomes.get(ack.outcome, 0) + 1

    async def resend(self, *, everything: bool = False) -> int:
        """Re-send the groups the consumer has room for, those unacknowledged for
        `resend_after_s` (held or not), or all of them."""
        now = time.monotonic()
        count = 0
        for item in list(self.pending.values()):
            if everything or item.release or now - item.sent_at > self.resend_after_s:
                if item.held_since:
                    self.hold_s += now - item.held_since
                item.sent_at, item.held_since, item.release = now, 0.0, False
                await self.sock.send(item.data)
                count += 1
        self.num_resent += count
        return count


async def announcements(
    sock: zmq.asyncio.Socket, limits: wire.Limits
) -> AsyncIterator[wire.Announce]:
    limited = LogLimiter(log)
    while True:
        data = await sock.recv()
        try:
            msg = wire.decode(data, limits)
        except WireError as exc:
            limited.log(exc.reason, logging.WARNING, "bad announcement: %s", exc)
            continue
        if isinstance(msg, wire.Announce):
            yield msg
