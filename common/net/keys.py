"""CurveZMQ key material on disk: which file belongs on which host; secrets readable by their
owner only.

`asyncgrpo keys DIR --producer NAME ...` writes (and, run again, adds producers, never
replacing a key that exists):

    DIR/server/server.key              the consumer's public key
    DIR/server/server.key_secret       the consumer's secret key: stays on the consumer's host
    DIR/clients/NAME.key               NAME's public key: the consumer's allowlist (delete the
                                       file to revoke that host; the consumer rereads the
                                       directory while it runs)
    DIR/producers/NAME/client.key_secret   NAME's secret key: copy this directory to host NAME
    DIR/producers/NAME/client.key          and nowhere else
    DIR/producers/NAME/server.key          (a copy of the consumer's public key)

The consumer takes `--keys DIR` (it reads `server/` and `clients/`); producer host NAME takes
`--keys DIR/producers/NAME`. Secret files are created 0600 and their directories 0700 (created
with those modes, never readable by others in between). A flat directory of the older layout
(`server.key_secret`, `client.key_secret` and the public keys side by side, the allowlist being
every `*.key` there) still loads, for both roles.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from common.errors import ConfigError

log = logging.getLogger("asyncgrpo.keys")
SERVER_DIR, CLIENTS_DIR, PRODUCERS_DIR = "server", "clients", "producers"
SERVER_NAME, CLIENT_NAME = "server", "client"


@dataclass(frozen=True, slots=True)
class Keys:
    """One side's CurveZMQ key pair (z85 bytes) and the consumer's public key. `allowlist` is
    the directory of public keys the consumer accepts (the consumer's side only)."""

    directory: Path
    public: bytes
    secret: bytes
    server_public: bytes
    allowlist: Path | None = None


def _write_cert(path: Path, public: bytes, secret: bytes | None) -> None:
    """A ZeroMQ certificate file (what `zmq.auth.load_certificate` reads); a secret one is
    created 0600, never readable by others, and an existing file is never replaced."""
    kind = "Secret" if secret is not None else "Public"
    lines = [
        f"#   ****  Generated on {time.strftime('%Y-%m-%d %H:%M:%S')} by asyncgrpo  ****",
        f"#   ZeroMQ CURVE **{kind}** Certificate",
        "",
        "metadata",
        "curve",
        f'    public-key = "{public.decode()}"',
    ]
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    mode = 0o600 if secret is not None else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")


def _pair(directory: Path, name: str) -> bytes:
    """`directory/name.key(_secret)`: created if absent; the public key either way."""
    secret_file = directory / f"{name}.key_secret"
    if secret_file.exists():
        public, _ = zmq.auth.load_certificate(secret_file)
        return public
    public, secret = zmq.curve_keypair()
    _write_cert(secret_file, public, secret)
    _write_cert(directory / f"{name}.key", public, None)
    return public


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def create_keys(directory: Path, producers: list[str]) -> list[Path]:
    """The consumer's key pair and one per producer name (existing keys are kept); returns the
    producer directories, one to copy to each producer host."""
    for name in producers:
        if not name or "/" in name or name.startswith("."):
            raise ConfigError(f"keys: a producer name must be a plain file name, not {name!r}")
    directory.mkdir(parents=True, exist_ok=True)
    server_public = _pair(_private_dir(directory / SERVER_DIR), SERVER_NAME)
    clients = directory / CLIENTS_DIR
    clients.mkdir(exist_ok=True)
    out = []
    for name in producers:
        home = _private_dir(directory / PRODUCERS_DIR / name)
        public = _pair(home, CLIENT_NAME)
        if not (home / f"{SERVER_NAME}.key").exists():
            _write_cert(home / f"{SERVER_NAME}.key", server_public, None)
        if not (clients / f"{name}.key").exists():
            _write_cert(clients / f"{name}.key", public, None)
        out.append(home)
    return out


def load_keys(directory: str | Path, role: str) -> Keys:
    """The keys of `role` ('server': the consumer, 'client': a producer) from a keys directory
    (see the module docstring); `ConfigError` saying which file is missing otherwise."""
    directory = Path(directory)
    home, server_dir, allowlist = directory, directory, directory
    if role == SERVER_NAME and (directory / SERVER_DIR).is_dir():
        home = server_dir = directory / SERVER_DIR
        allowlist = directory / CLIENTS_DIR
    elif role == CLIENT_NAME and not (directory / f"{CLIENT_NAME}.key_secret").exists():
        homes = sorted(p for p in (directory / PRODUCERS_DIR).glob("*") if p.is_dir())
        if (directory / PRODUCERS_DIR).is_dir():
            raise ConfigError(
                f"net.keys_dir = {str(directory)!r} is the consumer's keys directory: give a "
                f"producer its own, {directory / PRODUCERS_DIR}/NAME ("
                + ", ".join(p.name for p in homes[:5])
                + ")"
            )
    secret_file = home / f"{role}.key_secret"
    try:
        public, secret = zmq.auth.load_certificate(secret_file)
        server_public, _ = zmq.auth.load_certificate(server_dir / f"{SERVER_NAME}.key")
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"net.keys_dir = {str(directory)!r}: cannot read the {role} keys ({exc}); "
            "create them with `asyncgrpo keys DIR`"
        ) from None
    if secret is None:
        raise ConfigError(f"{secret_file} holds no secret key")
    if stat.S_IMODE(secret_file.stat().st_mode) & 0o077:
        log.warning("%s is readable by other users: chmod 600 it", secret_file)
    allowed = allowlist if role == SERVER_NAME else None
    return Keys(directory, public, secret, server_public, allowed)
