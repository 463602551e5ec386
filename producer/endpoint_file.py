"""A consumer's control endpoint read from the `endpoints.json` it writes at start.

`net.connect_file` (`asyncgrpo producer --connect-file PATH`) lets a producer start before its
consumer has bound its ports (port 0 = picked at start): `launch` starts every process at once,
and on a shared filesystem producers can follow a consumer's run directory. The file is written
by the consumer once all its sockets are bound, so its presence means the endpoint is live.
The endpoint is then held to the same rule as `net.connect` (leaving this machine needs
CurveZMQ keys or `--insecure`). While the file is not there the producer says that it waits,
where, and for how long (a line every 10 s): up to `net.handshake_timeout_s`, after which it
gives up (`NoConsumer`: exit 3, which a supervisor may restart); with `producer.follow` it
waits for ever, by design (a sweep's external producers serve run after run).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from common import config as C
from common.errors import ConfigError
from common.files import run_files as RF

log = logging.getLogger("asyncgrpo.producer")
_POLL_S = 0.05
_SAY_EVERY_S = 10.0


class NoConsumer(ConfigError):
    """No consumer answered (or wrote its endpoints.json) in time: the producer exits with
    `EXIT_CONSUMER_LOST` (3), which a supervisor may restart, not 2."""


async def wait_for_endpoint(path: Path, *, timeout_s: float, follow: bool = False) -> str:
    """The `control` endpoint in `path`, waiting up to `timeout_s` for the file to appear (for
    ever with `follow`), saying every 10 s that it waits."""
    started = time.monotonic()
    said: float | None = None
    while True:
        try:
            return (await asyncio.to_thread(RF.read_endpoints, path)).control
        except FileNotFoundError:
            problem = "it does not exist"
        except ValueError as exc:  # e.g. another writer's partial file
            problem = f"it is not a consumer's endpoints.json ({type(exc).__name__}: {exc})"
        now = time.monotonic()
        if not follow and now - started > timeout_s:
            raise NoConsumer(
                f"net.connect_file = {str(path)!r}: after net.handshake_timeout_s = "
                f"{timeout_s:g} s {problem} (has the consumer started, with that run directory?)"
            )
        if said is None or now - said >= _SAY_EVERY_S:
            said = now
            limit = (
                "for ever (producer.follow)"
                if follow
                else f"up to net.handshake_timeout_s = {timeout_s:g} s"
            )
            log.info(
                "waiting for the consumer's endpoints file %s (%s; %.0f s so far, %s)",
                path,
                problem,
                now - started,
                limit,
            )
        await asyncio.sleep(_POLL_S)


async def resolve_connect(cfg: C.Config) -> C.Config:
    """`cfg` with `net.connect` taken from `net.connect_file` when that is set; validated."""
    if not cfg.net.connect_file:
        return cfg
    path = Path(cfg.net.connect_file)
    endpoint = await wait_for_endpoint(
        path, timeout_s=cfg.net.handshake_timeout_s, follow=cfg.producer.follow
    )
    out = C.override(cfg, {"net.connect": endpoint})
    C.validate(out)
    return out
