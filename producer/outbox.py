"""The group sender: every finished group, kept until the consumer acknowledges it.

`Outbox` owns the PUSH socket and every finished group until the consumer acknowledges it:
at-least-once delivery. A group is re-sent when the consumer restarted (new run id) or when no
ack came within `resend_after_s`; the consumer's ledger makes duplicates harmless. A group the
consumer had no room for (ack `hold`: backpressure, consumer/server/admission.py) is held here, not
re-sent, until the consumer says `send` (or, should that word be lost, `resend_after_s`
later); held groups count against the producer's leases (`num_held`), so a full consumer
stops new generation instead of filling memory anywhere. Acks arrive in the consumer's status
replies on the control channel (producer/control.py); the worker hands them over.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import zmq.asyncio

from common import wire


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
