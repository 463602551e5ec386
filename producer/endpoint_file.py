"""A consumer's control endpoint read from the `endpoints.json` it writes at start.

`net.connect_file` (`asyncgrpo producer --connect-file PATH`) lets a producer start before its
consumer has bound its ports (port 0 = picked at start): `launch` starts every process at once,
and on a shared filesystem producers can follow a consumer's run directory. The file is written
by the consumer once all its sockets are bound, so its presence means the endpoint is live.
The endpoint is then held to the same rule as `net.connect` (leaving this machine needs
CurveZMQ keys or `--insecure`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from common import config as C
from common.errors import ConfigError
from common.files import run_files as RF

_POLL_S = 0.05


async def wait_for_endpoint(path: Path, *, timeout_s: float) -> str:
    """The `control` endpoint in `path`, waiting up to `timeout_s` for the file to appear."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return (await asyncio.to_thread(RF.read_endpoints, path)).control
        except FileNotFoundError:
            problem = "it does not exist"
        except ValueError as exc:  # e.g. another writer's partial file
            problem = f"it is not a consumer's endpoints.json ({type(exc).__name__}: {exc})"
        if time.monotonic() > deadline:
            raise ConfigError(
                f"net.connect_file = {str(path)!r}: after net.handshake_timeout_s = "
                f"{timeout_s:g} s {problem} (has the consumer started, with that run directory?)"
            )
        await asyncio.sleep(_POLL_S)


async def resolve_connect(cfg: C.Config) -> C.Config:
    """`cfg` with `net.connect` taken from `net.connect_file` when that is set; validated."""
    if not cfg.net.connect_file:
        return cfg
    path = Path(cfg.net.connect_file)
    endpoint = await wait_for_endpoint(path, timeout_s=cfg.net.handshake_timeout_s)
    out = C.override(cfg, {"net.connect": endpoint})
    C.validate(out)
    return out
