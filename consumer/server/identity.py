"""Who may speak for a producer id: the CurveZMQ public key that registered it (pure, no sockets).

Every message on the control and rollouts sockets arrives with the public key of the connection
it came over (ZeroMQ's `User-Id` metadata, which the ZAP authenticator sets to the client's key;
"" without CurveZMQ, where nobody is authenticated and an id is only a claim). A registration
binds its producer id to that key; from then on only that key may heartbeat, request leases, say
goodbye or deliver groups for the id (`allows`), so a producer cannot speak for another one
whose key it does not hold. An id is bound anew only once it is `free` (its producer is gone or
left and holds no open lease): a producer that moves to another host, with another key, keeps
its name. The bindings are part of the checkpoint, so a resumed consumer still knows them while
its producers re-register.

This decides which id a key may speak for; which keys may connect at all is the authenticator's
business (common/net/sockets.py: the public keys in the keys directory). Each host with its own
client key, the two together mean that one host cannot forge another host's groups.
"""

from __future__ import annotations

from typing import Any


class Identities:
    """producer id -> the key it registered with."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}

    def bind(self, producer_id: str, key: str, *, free: bool) -> bool:
        """Bind `producer_id` to `key` at registration; False (nothing changes) if the id is
        bound to another key and not `free`."""
        bound = self.keys.get(producer_id)
        if bound is not None and bound != key and not free:
            return False
        self.keys[producer_id] = key
        return True

    def allows(self, producer_id: str, key: str) -> bool:
        """May a message that came with `key` speak for `producer_id`? An id never bound (a
        lease restored from a checkpoint written before bindings were kept) is allowed."""
        bound = self.keys.get(producer_id)
        return bound is None or bound == key

    def forget(self, producer_id: str) -> None:
        self.keys.pop(producer_id, None)

    def state_dict(self) -> dict[str, Any]:
        return {"keys": dict(self.keys)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.keys = {str(k): str(v) for k, v in state.get("keys", {}).items()}
