"""A producer serving the snapshot files it holds to other producers (a relay of the fan-out).

`Relay` owns one ROUTER socket bound at `producer.relay_host:relay_port` and answers
`wire.FileChunkRequest` with a chunk (`wire.encode_chunk`: head and bytes in two frames, as the
consumer's data socket does) from the files it is given, kept in its private cache:

- a file being fetched (`begin`): it serves the chunks its fetcher has already checked against
  the plan's per-chunk digest and written (`ready`, producer/fetch/fetcher.py), while the rest
  are still on their way. A request for a chunk not held yet is held here until it is
  (cut-through at chunk granularity: a chain of relays streams a snapshot, each hop one chunk
  behind the one above it), until the fetch fails (`abort`: refused, `snapshot_gone`), or at
  most `hold_s`;
- a file fetched and verified completely (`offer`), served whole.

A file that is gone (the cache keeps the two newest versions) or never given is refused
(`Reject`, `snapshot_gone`); so is a request beyond `max_held` held requests (`busy`); a
malformed request is refused with its reason and counted. Nothing a peer sends can stop the
relay: its loop only ends when cancelled. Requests are answered concurrently (one task each),
so a held request never delays one for a chunk that is here.

Trust runs the other way: the consumer tells fetchers the per-chunk hashes, so a fetcher never
needs to trust a relay (consumer/snapshots/fanout.py); a relay still serves only chunks that
matched their digest, so a corrupt upstream never travels further. With CurveZMQ keys the
relay serves encrypted with the producers' client keypair (every key holder knows its public
key and no one else can connect); without keys it follows the loopback rule of every bound
socket (`--insecure`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import zmq
import zmq.asyncio

from common import wire
from common.errors import WireError
from common.net.keys import Keys
from common.net.log_limit import LogLimiter
from common.net.sockets import server_socket
from common.weights import chunk_manifest as cm

log = logging.getLogger("asyncgrpo.producer")
HOLD_S = 60.0  # the longest a request waits here for a chunk still on its way
MAX_HELD = 1024  # requests held at once; more are refused (`busy`)
_T = TypeVar("_T")


@dataclass(slots=True)
class _File:
    """A file served: complete (`chunks` None) or still being fetched (`ready` chunk indices)."""

    path: Path
    chunks: cm.ChunkHashes | None = None
    ready: set[int] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # set, then replaced

    def holds(self, offset: int, size: int) -> bool:
        """True when every byte of `[offset, offset + size)` is here."""
        c = self.chunks
        if c is None or size <= 0:
            return True
        first, last = offset // c.chunk_bytes, (offset + size - 1) // c.chunk_bytes
        return all(i in self.ready for i in range(first, last + 1))

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


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
        hold_s: float = HOLD_S,
        max_held: int = MAX_HELD,
    ) -> None:
        # the relay is a CURVE server with the producers' own keypair (see the module doc)
        serving = Keys(keys.directory, keys.public, keys.secret, keys.public) if keys else None
        self.sock, bound = server_socket(
            ctx,
            zmq.ROUTER,
            host=host,
            port=port,
            keys=serving,
            insecure=insecure,
            max_message_bytes=max_message_bytes,
        )
        self.source = wire.Source(f"tcp://{host}:{bound}", keys.public.decode() if keys else "")
        self.limits = wire.Limits(max_message_bytes=max_message_bytes)
        self.max_chunk = max_message_bytes - 4096
        self.hold_s, self.max_held = hold_s, max_held
        self._files: dict[tuple[int, str], _File] = {}
        self._expected: set[int] = set()  # versions being fetched here, a file not begun yet
        self._arrived = asyncio.Event()  # set (then replaced) when a file is given or settled
        self._tasks: set[asyncio.Task[None]] = set()
        self._num_held = 0
        self.counters: dict[str, float] = {}
        self._log = LogLimiter(log)

    # -- what is served ------------------------------------------------------------------------
    def expect(self, version: int) -> None:
        """A fetch of `version` starts here: a request for one of its files not begun yet is
        held until the file is (the consumer may name this relay before its plan arrives)."""
        self._expected.add(version)

    def settle(self, version: int) -> None:
        """The fetch of `version` ended: what was not begun or offered by now is refused."""
        self._expected.discard(version)
        self._wake_all()

    def begin(self, version: int, file: str, path: Path, chunks: cm.ChunkHashes) -> None:
        """Serve `path`, still being fetched, as `file` of `version`: chunk by chunk as `ready`
        says each is checked and written there."""
        self._put(version, file, _File(path, chunks))

    def ready(self, version: int, file: str, index: int) -> None:
        """Chunk `index` of a file being fetched matched its digest and is written."""
        entry = self._files.get((version, file))
        if entry is not None and entry.chunks is not None:
            entry.ready.add(index)
            entry.wake()

    def abort(self, version: int, file: str) -> None:
        """The fetch of a file `begin` gave failed: refuse it from now on (held requests too)."""
        entry = self._files.get((version, file))
        if entry is not None and entry.chunks is not None:
            del self._files[version, file]
            entry.wake()

    def offer(self, version: int, file: str, path: Path) -> None:
        """Serve `path` (verified, complete) as `file` of `version`; forget versions older than
        the two newest offered."""
        self._put(version, file, _File(path))

    def _put(self, version: int, file: str, entry: _File) -> None:
        old = self._files.get((version, file))
        self._files[version, file] = entry
        if old is not None:
            old.wake()  # its held requests look again (and find `entry`)
        for key in [k for k in self._files if k[0] < version - 1]:
            self._files.pop(key).wake()
        self._expected = {v for v in self._expected if v >= version - 1}
        self._wake_all()

    def _wake_all(self) -> None:
        self._arrived.set()
        self._arrived = asyncio.Event()

    # -- serving -------------------------------------------------------------------------------
    async def serve(self) -> None:
        """Answer chunk requests until cancelled."""
        try:
            while True:
                identity, data = await self._recv()
                if identity is None:
                    continue
                task = asyncio.ensure_future(self._answer(identity, data))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            for task in list(self._tasks):
                task.cancel()

    async def _answer(self, identity: bytes, data: bytes) -> None:
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
        size = max(0, min(msg.max_bytes, self.max_chunk))
        for last in (False, True):  # a file renamed once complete, or removed: look once more
            entry = await self._held(msg, size)
            try:
                on_disk, data = await asyncio.to_thread(_read, entry.path, msg.offset, size)
                break
            except OSError:
                if last:
                    raise WireError("snapshot_gone", f"v{msg.version} is no longer kept") from None
        total = on_disk if entry.chunks is None else entry.chunks.num_bytes
        if not 0 <= msg.offset <= total:
            raise WireError("bad_offset", f"offset {msg.offset} outside [0, {total}]")
        data = data[: total - msg.offset]
        if not size:  # a fetcher's probe: is this relay alive? (producer/fetch/chunk_client.py)
            self._count("relay_probes_answered")
        else:
            self._count("relay_chunks_served")
            self._count("relay_bytes_served", len(data))
        return wire.Chunk(
            req=msg.req, version=msg.version, offset=msg.offset, total_bytes=total, data=data
        )

    async def _held(self, msg: wire.FileChunkRequest, size: int) -> _File:
        """The file `msg` asks for, once it holds the bytes asked for (see the module doc)."""
        key = (msg.version, msg.file)
        entry = self._files.get(key)
        if entry is None and msg.version in self._expected:
            entry = await self._hold(self._arrival(key))
        if entry is None:
            raise WireError("snapshot_gone", f"v{msg.version} {msg.file[:16]} is not served here")
        if entry.chunks is None:
            return entry
        if not 0 <= msg.offset <= entry.chunks.num_bytes:
            raise WireError("bad_offset", f"offset {msg.offset} outside the file")
        size = min(size, entry.chunks.num_bytes - msg.offset)
        if entry.holds(msg.offset, size):
            return entry
        return await self._hold(self._wait(key, entry, msg.offset, size))

    async def _hold(self, waiting: Coroutine[None, None, _T]) -> _T:
        """Await `waiting` as a held request: counted, at most `max_held` at once, `hold_s`."""
        if self._num_held >= self.max_held:
            waiting.close()
            raise WireError("busy", f"{self._num_held} requests held here")
        self._count("relay_requests_held")
        self._num_held += 1
        try:
            async with asyncio.timeout(self.hold_s):
                return await waiting
        except TimeoutError:
            raise WireError("snapshot_gone", "the chunk asked for did not come in time") from None
        finally:
            self._num_held -= 1

    async def _arrival(self, key: tuple[int, str]) -> _File | None:
        """The file `key` once begun or offered; None once its version is settled without it."""
        while (entry := self._files.get(key)) is None and key[0] in self._expected:
            await self._arrived.wait()
        return entry

    async def _wait(self, key: tuple[int, str], entry: _File, offset: int, size: int) -> _File:
        while not entry.holds(offset, size):
            await entry.changed.wait()
            now = self._files.get(key)
            if now is None:
                raise WireError("snapshot_gone", f"v{key[0]} {key[1]}: its fetch failed")
            entry = now
        return entry

    def _count(self, key: str, n: float = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self.sock.close(linger=0)


def _read(path: Path, offset: int, size: int) -> tuple[int, bytes]:
    fd = os.open(path, os.O_RDONLY)
    try:
        total = os.fstat(fd).st_size
        return total, os.pread(fd, size, offset) if 0 <= offset <= total else b""
    finally:
        os.close(fd)
