"""Snapshot announcements: the `Announce` messages the consumer publishes on its PUB socket.

`announcements(sock, limits)` yields them from the producer's SUB socket; one that does not
decode is logged (rate-limited) and skipped. They are hints: a missed one only costs latency,
because every control reply carries the newest snapshot too.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import zmq.asyncio

from common import wire
from common.errors import WireError
from common.net.log_limit import LogLimiter

log = logging.getLogger("asyncgrpo.producer")


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
