"""ZeroMQ sockets per role: high-water marks, message-size limits, linger, CurveZMQ.

Roles (DESIGN.md): the consumer binds `control` (ROUTER), `rollouts` (PULL), `announce` (PUB)
and `data` (ROUTER, snapshot chunks); producers connect a DEALER, a PUSH, a SUB and a DEALER.
Invariants:
- Every socket gets ZMQ_MAXMSGSIZE (libzmq drops the connection of a peer that sends more) and
  LINGER 0 (closing never blocks shutdown; unacknowledged groups are re-sent, not lingered).
- ROUTER sets ROUTER_MANDATORY, so a reply to a vanished producer raises instead of vanishing.
  Data that must not be lost never rides PUB: announcements are hints, every reply repeats them.
- `bind` refuses a non-loopback address without keys unless `insecure` (the rule is
  common/net/endpoints.py's; config validation says the same earlier, with the key to change);
  ports are read back, never guessed.
- With keys (common/net/keys.py), all traffic is CurveZMQ-encrypted and only clients whose public
  key is in the consumer's allowlist are accepted (consumer/key_gate.py, a ZAP authenticator
  thread owned by the consumer's context).
"""

from __future__ import annotations

from typing import Any, TypeVar

import zmq

from common.errors import ConfigError
from common.net.endpoints import is_loopback
from common.net.keys import Keys

# The socket class a context makes: `zmq.Socket` for a `zmq.Context`, `zmq.asyncio.Socket` for a
# `zmq.asyncio.Context` (producers use the asyncio flavour, the consumer the blocking one).
_SocketT = TypeVar("_SocketT", bound=zmq.Socket[Any])


def configure(sock: zmq.Socket[Any], *, max_message_bytes: int, hwm: int = 1000) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)


def server_socket(
    ctx: zmq.Context[_SocketT],
    kind: int,
    *,
    host: str,
    port: int,
    keys: Keys | None,
    insecure: bool,
    max_message_bytes: int,
    hwm: int = 1000,
) -> tuple[_SocketT, int]:
    """Create, configure and bind a consumer socket. Returns it and the bound port."""
    if keys is None and not insecure and not is_loopback(host):
        raise ConfigError(
            f"refusing to bind {host}: not loopback and no CurveZMQ keys "
            "(set net.keys_dir, or net.insecure = true)"
        )
    sock = ctx.socket(kind)
    configure(sock, max_message_bytes=max_message_bytes, hwm=hwm)
    if kind == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if keys is not None:
        sock.curve_secretkey = keys.secret
        sock.curve_publickey = keys.public
        sock.curve_server = True
    try:
        if port:
            sock.bind(f"tcp://{host}:{port}")
        else:
            port = sock.bind_to_random_port(f"tcp://{host}")
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise ConfigError(
            f"cannot bind tcp://{host}:{port}: {exc}; choose another net.*_port"
        ) from None
    return sock, port


def client_socket(
    ctx: zmq.Context[_SocketT],
    kind: int,
    endpoint: str,
    *,
    keys: Keys | None,
    max_message_bytes: int,
    hwm: int = 1000,
) -> _SocketT:
    """Create, configure and connect a producer socket."""
    sock = ctx.socket(kind)
    configure(sock, max_message_bytes=max_message_bytes, hwm=hwm)
    if keys is not None:
        sock.curve_secretkey = keys.secret
        sock.curve_publickey = keys.public
        sock.curve_serverkey = keys.server_public
    if kind == zmq.SUB:
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    return sock


def endpoint_with_port(endpoint: str, port: int) -> str:
    """'tcp://host:5555' with another port: how producers reach the consumer's other sockets."""
    base, _, _ = endpoint.rpartition(":")
    return f"{base}:{port}"
