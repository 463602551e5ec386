"""Endpoint rules: which addresses never leave this machine, and what a control endpoint is.

Two layers hold these rules: config validation (common/config, `net.bind_host` and
`net.connect`: refused early, naming the key to change) and socket creation (common/net/sockets.py:
`server_socket` refuses a non-loopback bind without keys). Both read them here, so sockets
need not import the config.

Conventions:
- A control endpoint is `tcp://HOST:PORT`; the consumer's other sockets are reached by
  replacing PORT (common/net/sockets.py `endpoint_with_port`).
- Loopback is 127.0.0.0/8, ::1 and the name `localhost`; `ipc://` and `inproc://` endpoints
  count as loopback (they never leave the host). Any other name counts as leaving the machine.
- A consumer bound to every interface (0.0.0.0, ::, *) advertises, in endpoints.json, the host
  `net.advertise_host` names, else this host's name (`socket.gethostname()`): an address another
  host can connect to, never the wildcard (`advertised_host`).
"""

from __future__ import annotations

import ipaddress
import socket

WILDCARDS = frozenset({"0.0.0.0", "::", "*"})  # bind to every interface; connect to none


def is_loopback(host: str) -> bool:
    """True for addresses that never leave this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def advertised_host(bind_host: str, advertise_host: str = "") -> str:
    """The host a consumer bound at `bind_host` tells producers to connect to: `advertise_host`
    when given, this host's name for a wildcard bind, else `bind_host` itself."""
    if advertise_host:
        return advertise_host
    return socket.gethostname() if bind_host in WILDCARDS else bind_host


def tcp_endpoint(host: str, port: int) -> str:
    """'tcp://host:port', an IPv6 address in brackets ('tcp://[::1]:5555')."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def listening(bound: str, advertised: str) -> str:
    """`listening on tcp://HOST:PORT`; when bound to another address than the one producers
    are told (a wildcard, or `--advertise`), both: what was bound and what endpoints.json
    advertises."""
    if bound == advertised:
        return f"listening on {bound}"
    host = endpoint_host(bound)
    every = " (every interface)" if host in ("0.0.0.0", "::", "*") else ""
    return (
        f"listening on {bound}{every}; producers are told {advertised} (endpoints.json; "
        "`asyncgrpo consumer --advertise HOST` names another)"
    )


def endpoint_host(endpoint: str) -> str:
    """'tcp://host:port' -> 'host' (ipc:// and inproc:// count as loopback)."""
    scheme, _, rest = endpoint.partition("://")
    if scheme != "tcp":
        return "127.0.0.1"
    return rest.rsplit(":", 1)[0].strip("[]")


def endpoint_problem(endpoint: str) -> str:
    """Why `endpoint` is not `tcp://HOST:PORT` (the consumer's other ports are found by
    replacing PORT), with the likely fix; "" when it is one."""
    scheme, sep, rest = endpoint.partition("://")
    host, colon, port = rest.rpartition(":")
    if not sep:
        fix = endpoint if ":" in endpoint else f"{endpoint}:5555"
        return f"not an endpoint tcp://HOST:PORT (did you mean 'tcp://{fix}'?)"
    if scheme != "tcp":
        return f"only tcp:// endpoints are supported, not {scheme}://"
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return "not an endpoint tcp://HOST:PORT (a host, then a port in 1-65535)"
    return ""
