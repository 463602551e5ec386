"""A producer serving the snapshot files it holds to other producers (a relay of the fan-out).

`Relay` owns one ROUTER socket bound at `producer.relay_host:relay_port` and answers
`wire.FileChunkRequest` with a chunk (`wire.encode_chunk`: head and bytes in two frames, as the
consumer's data socket does) from files `offer`ed to it: only files this producer fetched and
verified completely (producer/fetch/fetcher.py), kept in its private cache. A file that is gone
(the cache keeps the two newest versions) or not offered is refused (`Reject`, `snapshot_gone`);
a malformed request is refused with its reason and counted. Nothing a peer sends can stop the
relay: its loop only ends when cancelled.

Trust runs the other way: the consumer tells fetchers the per-chunk hashes, so a fetcher never
needs to trust a relay (consumer/snapshots/fanout.py). With CurveZMQ keys the relay serves encrypted
with the producers' client keypair (every key holder knows its public key and no one else can
connect); without keys it follows the loopback rule of every bound socket (`--insecure`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import zmq
import zmq.asyncio

from common import wire
from common.errors import WireError
from common.keys import Keys
from common.log_limit import LogLimiter
from common.sockets import server_socket

log = logging.getLogger("asyncgrpo.producer")


class Relay:
    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        *,
        host: str,
        port: int,
        keys: Keys | None,
        insecure: bool,
        max_message_bytes: int,
    ) -> None:
        # the relay is a CURVE server with the producers' own keypair (see the module doc)
        serving = Keys(keys.directory, keys.public, keys.secret, keys.public) if keys else None
        self.sock, bound = server_socket(
            ctx, zmq.ROUTER, host=host, port=port, keys=serving, insecure=insecure,
            max_message_bytes=max_message_bytes,
        )  # fmt: skip
        self.source = wire.Source(f"tcp://{host}:{bound}", keys.public.decode() if keys else "")
        self.limits = wire.Limits(max_message_bytes=max_message_bytes)
        self.max_chunk = max_message_bytes - 4096
        self._files: dict[tuple[int, str], Path] = {}
        self.counters: dict[str, float] = {}
        self._log = LogLimiter(log)

    def offer(self, version: int, file: str, path: Path) -> None:
        """Serve `path` (verified, complete) as `file` of `version`; forget versions older than
        the two newest offered."""
        self._files[version, file] = path
        for key in [k for k in self._files if k[0] < version - 1]:
            del self._files[key]

    async def serve(self) -> None:
        """Answer chunk requests until cancelled."""
        while True:
            identity, data = await self._recv()
            if identity is None:
                continue
            req = 0
            try:
                msg = wire.decode(data, self.limits)
                if not isinstance(msg, wire.FileChunkRequest):
                    raise WireError("unexpected_kind", type(msg).__name__)
                req = msg.req
                reply = wire.encode_chunk(await self._chunk(msg))
            except WireError as exc:
                self._count(f"relay_rejected.{exc.reason}")
                self._log.log(exc.reason, logging.INFO, "relay refused a request: %s", exc)
                reply = [wire.encode(wire.Reject(req, exc.reason, exc.detail))]
            try:
                await self.sock.send_multipart([identity, *reply], zmq.NOBLOCK, copy=False)
            except zmq.ZMQError:  # the fetcher is gone or its pipe is full: it times out
                self._count("relay_reply_undeliverable")

    async def _recv(self) -> tuple[bytes | None, bytes]:
        frames = await self.sock.recv_multipart()
        if len(frames) != 2:
            self._count("relay_rejected.bad_frames")
            return None, b""
        return frames[0], frames[1]

    async def _chunk(self, msg: wire.FileChunkRequest) -> wire.Chunk:
        path = self._files.get((msg.version, msg.file))
        if path is None:
            raise WireError("snapshot_gone", f"v{msg.version} {msg.file[:16]} is not served here")
        size = max(0, min(msg.max_bytes, self.max_chunk))
        try:
            total, data = await asyncio.to_thread(_read, path, msg.offset, size)
        except OSError:
            raise WireError("snapshot_gone", f"v{msg.version} is no longer kept here") from None
        if not 0 <= msg.offset <= total:
            raise WireError("bad_offset", f"offset {msg.offset} outside [0, {total}]")
        self._count("relay_chunks_served")
        self._count("relay_bytes_served", len(data))
        return wire.Chunk(msg.req, msg.version, msg.offset, total, data)

    def _count(self, key: str, n: float = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def close(self) -> None:
        self.sock.close(linger=0)


def _read(path: Path, offset: int, size: int) -> tuple[int, bytes]:
    fd = os.open(path, os.O_RDONLY)
    try:
        total = os.fstat(fd).st_size
        return total, os.pread(fd, size, offset) if 0 <= offset <= total else b""
    finally:
        os.close(fd)
