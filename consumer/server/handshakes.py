"""Connections to the control socket that fail their security handshake, said in the consumer's
log (network thread `consumer-net`).

A producer whose CurveZMQ setup does not match the consumer's never reaches the key gate
(consumer/key_gate.py, which logs each key it refuses): one without keys connecting to a
consumer with them (a ZMTP mechanism mismatch), one with keys connecting to a consumer without
them, or one whose copy of the consumer's public key is not this consumer's (the handshake's
cryptography fails). libzmq retries such a connection every few hundred milliseconds, silently
on both sides; the control socket's monitor sees each failure, and `Handshakes.on_events`
says it: counted (`rejected.handshake_<kind>` in the ledger's counters, beside the key gate's
`refused_keys`) and logged, rate-limited to one line per kind every 10 s with the count held
back (common/net/log_limit.py). libzmq does not tell a listening socket who the peer was, so
the line names the kind and what to check, not the address.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from common.net.log_limit import LogLimiter

log = logging.getLogger("asyncgrpo.consumer")
EVENTS = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
# the ZMTP protocol errors of a failed handshake, by kind: (counter suffix, what to check)
KINDS: dict[int, tuple[str, str]] = {
    int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH): (
        "mechanism",
        "it connects without CurveZMQ keys while this consumer has them, or the other way "
        "round: give both sides keys (--keys; `asyncgrpo keys DIR --producer NAME`) or neither",
    ),
    int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC): (
        "cryptographic",
        "its keys were not made for this consumer (the server.key it holds is another "
        "consumer's): copy keys/producers/NAME/ from this consumer's `asyncgrpo keys` directory",
    ),
}
OTHER = (
    "other",
    "the handshake broke off: a client whose CurveZMQ keys do not match this consumer's "
    "(--keys on both sides or neither; keys/producers/NAME/ from this consumer's `asyncgrpo "
    "keys` directory), or a broken link",
)


class Handshakes:
    """The control socket's monitor, read on the network thread (module docstring)."""

    def __init__(self, control: zmq.Socket[Any], count: Callable[[str, int], None]) -> None:
        self.monitor: zmq.Socket[Any] = control.get_monitor_socket(EVENTS)
        self._count = count
        self._log = LogLimiter(log)

    def on_events(self) -> None:
        """Drain the monitor: count and say each failed handshake."""
        while self.monitor.poll(0):
            event = parse_monitor_message(self.monitor.recv_multipart())
            value = int(event["value"])
            kind, check = KINDS.get(value, OTHER)
            self._count(f"rejected.handshake_{kind}", 1)
            self._log.log(
                f"handshake.{kind}",
                logging.WARNING,
                "refused a connection to the control socket %s: its security handshake failed "
                "(%s, %s %#x): %s",
                event["endpoint"].decode("utf-8", "replace"),
                kind,
                zmq.Event(event["event"]).name,
                value,
                check,
            )

    def close(self) -> None:
        self.monitor.close(linger=0)
