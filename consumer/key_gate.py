"""Which CurveZMQ clients may connect: the allowlist of public keys, and every refusal logged.

A ZAP authenticator thread (pyzmq's `ThreadAuthenticator`) asks `KeyGate.callback` about each
CurveZMQ handshake on the consumer's sockets. The answer is "yes" exactly when the client's
public key is one of the `*.key` files in the allowlist directory (`DIR/clients/` of
`asyncgrpo keys DIR`; see common/net/keys.py). Invariants:
- The directory is read again when its modification time changes (checked at most once a
  second), so deleting `clients/NAME.key` revokes host NAME's new connections while the
  consumer runs; a connection already admitted stays (restart with `--resume` to cut it).
- Every refusal is counted (`refused`) and logged with the peer's address and the first
  characters of its key: rate-limited per address (common/net/log_limit.py), so a producer
  retrying with a wrong key writes one line every 10 s, not one per attempt. libzmq then sends
  the client an ERROR (ZAP status 400), which a producer reports as a refused key
  (producer/control.py) instead of waiting for a consumer that seems to be down.
- Which producer id a key may speak for is another question (consumer/server/identity.py).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from common.net.keys import Keys
from common.net.log_limit import LogLimiter

log = logging.getLogger("asyncgrpo.consumer")
_RESCAN_S = 1.0


class KeyGate(ThreadAuthenticator):
    """The consumer's ZAP handler: admits the allowlist's keys, logs the rest."""

    def __init__(self, ctx: zmq.Context[Any], allowlist: Path) -> None:
        super().__init__(ctx)
        self.allowlist = allowlist
        self.refused = 0
        self._keys: set[bytes] = set()
        self._stamp: float | None = None
        self._checked = 0.0
        self._peer = ""  # the address of the handshake being decided (one at a time)
        self._lock = threading.Lock()
        self._log = LogLimiter(log)

    def start(self) -> None:
        super().start()
        self._reload(time.monotonic())
        self.configure_curve_callback(domain="*", credentials_provider=self)

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        # frames: version, request id, domain, address, identity, mechanism, credentials...
        self._peer = msg[3].decode("utf-8", "replace") if len(msg) > 3 else "?"
        await super().handle_zap_message(msg)

    def callback(self, domain: str, key: bytes) -> bool:
        """True when the z85 public key `key` is in the allowlist (pyzmq's provider hook)."""
        now = time.monotonic()
        if now - self._checked >= _RESCAN_S:
            self._reload(now)
        if key in self._keys:
            return True
        with self._lock:
            self.refused += 1
        self._log.log(
            f"refused.{self._peer}",
            logging.WARNING,
            "refused a CurveZMQ connection from %s: its public key %s... is not in the "
            "allowlist %s (a producer host not registered with `asyncgrpo keys`, or revoked)",
            self._peer,
            key[:8].decode("ascii", "replace"),
            self.allowlist,
        )
        return False

    def _reload(self, now: float) -> None:
        self._checked = now
        try:
            stamp = self.allowlist.stat().st_mtime
        except OSError:
            stamp = None
        if stamp == self._stamp and self._stamp is not None:
            return
        keys: set[bytes] = set()
        for path in sorted(self.allowlist.glob("*.key")):
            try:
                public, _ = zmq.auth.load_certificate(path)
            except (OSError, ValueError) as exc:
                log.warning("allowlist: cannot read %s (%s): ignored", path, exc)
                continue
            keys.add(public)
        if self._stamp is not None and keys != self._keys:
            log.info("allowlist %s changed: %d keys admitted", self.allowlist, len(keys))
        self._keys, self._stamp = keys, stamp


def start_key_gate(ctx: zmq.Context[Any], keys: Keys) -> KeyGate:
    """The consumer's authenticator, started: admits the clients of `keys.allowlist`."""
    assert keys.allowlist is not None, "the consumer's keys carry the allowlist"
    gate = KeyGate(ctx, keys.allowlist)
    gate.start()
    return gate
