"""The consumer's data socket: snapshot chunks, served on their own thread, apart from control.

`DataPlane` owns one ROUTER socket (`net.data_port`, announced to producers in the welcome's
`RunSpec.data_port`), the thread that answers it, and the ZeroMQ context both live in: its own,
so its I/O thread (the one that copies chunks into the kernel) is not the one that carries
control messages (sharing it, a 64-way fan-out of 4 MiB chunks held a probe's control round
trip p99 at ~430 ms; apart, ~30-50 ms). It answers exactly one request,
`wire.FileChunkRequest`, with a two-frame chunk reply (`wire.encode_chunk`: a `chunk_head` and
the file's bytes, sent without copying) read from the consumer's kept snapshot files
(`model.safetensors` or `weights.delta`), or from its model directory (file `model/NAME`, for a
producer without a copy: only the files the run spec lists, consumer/snapshots/base_model.py);
anything else is refused with a `wire.Reject` and counted. Who fetches what from whom is
decided on the network thread (consumer/snapshots/fanout.py plans fetches over control); this
thread only reads bytes, so a flood of chunk requests never delays a lease, a heartbeat or a
registration (they wait in another socket's queue, on another thread; file reads and socket
sends release the interpreter lock).

Invariants:
- Same bind and security rules as control (common/net/sockets.py `server_socket`): with keys it is
  a CurveZMQ server, and its context runs its own authenticator over the same allowlist
  (consumer/key_gate.py), which admits or refuses a peer (and logs the refusal) before it can
  send a single request; its refusals (`refused_keys`) go into the same
  `rejected.unknown_key` as control's (consumer/server/server.py).
- Requests are tiny: the socket's ZMQ_MAXMSGSIZE is `MAX_REQUEST_BYTES` (a larger frame drops
  the peer's connection in libzmq) and decoding is bounded (common/wire/).
- Nothing a peer sends stops the thread: a malformed request is answered with a `Reject` and
  counted (`data_rejected.<reason>`); even a bug of ours is counted
  (`data_rejected.internal_error`) and logged once per kind; only `stop()` ends the loop.
- A chunk is at most `chunk_limit` bytes, whatever the request asks; a version no longer kept
  is `snapshot_gone`, an offset outside the file `bad_offset`. Chunks are sent from read-only
  memory maps of the files (`FileMaps`), without a copy in this process. Replies never block (a peer
  whose pipe is full loses the reply and asks again: `data_reply_undeliverable`).
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from common import wire
from common.errors import WireError
from common.net.keys import Keys
from common.net.log_limit import LogLimiter
from common.net.sockets import server_socket
from common.weights import delta as D
from common.weights import snapshot as snap
from consumer.key_gate import start_key_gate
from consumer.snapshots.base_model import PREFIX

log = logging.getLogger("asyncgrpo.consumer")
MAX_REQUEST_BYTES = 64 << 10
FILE_NAMES = {"weights": snap.WEIGHTS_FILE, "delta": D.DELTA_FILE}
_POLL_MS = 100  # how often the thread looks at its stop flag when idle
_LIMITS = wire.Limits(max_message_bytes=MAX_REQUEST_BYTES, max_items=64, max_objects=256)


class DataPlane:
    """The data socket and its thread. Build it (binds), `start()` it, `stop()` it."""

    def __init__(
        self,
        root: Path,
        *,
        host: str,
        port: int,
        keys: Keys | None,
        insecure: bool,
        chunk_limit: int,
        count: Callable[[str, int], None],
        model_dir: Path | None = None,
        model_files: frozenset[str] = frozenset(),
    ) -> None:
        self.root, self.chunk_limit, self._count = root, chunk_limit, count
        self.model_dir, self.model_files = model_dir, model_files  # what `model/NAME` serves
        self.ctx: zmq.Context[Any] = zmq.Context()
        self._gate = start_key_gate(self.ctx, keys) if keys is not None else None
        try:
            self.sock, self.port = server_socket(
                self.ctx,
                zmq.ROUTER,
                host=host,
                port=port,
                keys=keys,
                insecure=insecure,
                max_message_bytes=MAX_REQUEST_BYTES,
            )
        except BaseException:
            self._close_context()
            raise
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="consumer-data", daemon=True)
        self._log = LogLimiter(log)
        self._maps = FileMaps()

    @property
    def refused_keys(self) -> int:
        """CurveZMQ connections this socket's authenticator refused (keys not in the allowlist)."""
        return self._gate.refused if self._gate is not None else 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the thread, close the socket and the context (also when never started)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sock.close(linger=0)
        self._close_context()

    def _close_context(self) -> None:
        if self._gate is not None:
            self._gate.stop()
        self.ctx.destroy(linger=0)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(_POLL_MS):
                continue
            while not self._stop.is_set():
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._answer(frames)

    def _answer(self, frames: list[zmq.Frame]) -> None:
        """Answer one request (never raises: see the module doc)."""
        identity, req = frames[0].bytes, 0  # a ROUTER's first frame: who asked
        try:
            if len(frames) != 2:
                raise WireError("multipart", f"{len(frames) - 1} frames")
            msg = wire.decode(frames[1].buffer, _LIMITS)
            req = getattr(msg, "req", 0)
            if not isinstance(msg, wire.FileChunkRequest):
                raise WireError("unexpected_kind", type(msg).__name__)
            reply: list[Any] = wire.encode_chunk(self._chunk(msg))
            self._count("chunk_bytes_served", len(reply[1]))
            self._count("chunks_served", 1)
        except WireError as exc:
            self._count(f"data_rejected.{exc.reason}", 1)
            self._log.log(f"data.{exc.reason}", logging.WARNING, "refused a data request: %s", exc)
            reply = [wire.encode(wire.Reject(req, exc.reason, exc.detail))]
        except Exception as exc:  # a bug of ours: counted, logged once per kind, never fatal
            self._count("data_rejected.internal_error", 1)
            self._log.log(
                f"data.internal.{type(exc).__name__}",
                logging.ERROR,
                "internal error serving a chunk",
                exc_info=True,
            )
            reply = [wire.encode(wire.Reject(req, "internal_error", type(exc).__name__))]
        try:
            self.sock.send_multipart([identity, *reply], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:  # the peer is gone (ROUTER_MANDATORY) or its pipe is full
            self._count("data_reply_undeliverable", 1)

    def _chunk(self, msg: wire.FileChunkRequest) -> wire.Chunk:
        name = FILE_NAMES.get(msg.file)
        if msg.file.startswith(PREFIX):  # a file of the model directory the run spec lists
            listed = msg.file[len(PREFIX) :]
            if self.model_dir is None or listed not in self.model_files:
                raise WireError("bad_value", "not a file of the run spec's model_files")
            path = self.model_dir / listed
        elif name is None:
            raise WireError("bad_value", "file must be weights, delta or model/NAME")
        else:
            path = snap.snapshot_dir(self.root, msg.version) / name
        total, view = self._maps.view(path, msg.version)
        if not 0 <= msg.offset <= total:
            raise WireError("bad_offset", f"offset {msg.offset} outside [0, {total}]")
        size = max(0, min(msg.max_bytes, self.chunk_limit))
        return wire.Chunk(
            req=msg.req,
            version=msg.version,
            offset=msg.offset,
            total_bytes=total,
            data=view[msg.offset :][:size],
        )


class FileMaps:
    """Read-only memory maps of the newest snapshot files served (at most `keep`), so a chunk
    is sent straight from the page cache: no read into a buffer, no copy before the socket.

    A map is made again when its path names another file (inode, size or mtime changed) and
    dropped, never closed, when it falls out: a chunk still on its way keeps it alive. Snapshot
    files are never changed in place (written under a temporary name, renamed; pruned by
    unlinking), which is what makes mapping them safe: a mapped file truncated by someone else
    would fault on access."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._maps: dict[str, tuple[tuple[int, int, int], memoryview]] = {}

    def view(self, path: Path, version: int) -> tuple[int, memoryview]:
        """(size in bytes, a read-only view of the whole file); `WireError` `snapshot_gone`
        when it is not there or cannot be read."""
        try:
            st = os.stat(path)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            known = self._maps.get(str(path))
            if known is not None and known[0] == key:
                return st.st_size, known[1]
            view = _map(path, st.st_size)
        except (OSError, ValueError):
            raise WireError("snapshot_gone", f"version {version} is no longer kept") from None
        self._maps.pop(str(path), None)
        self._maps[str(path)] = (key, view)
        while len(self._maps) > self.keep:
            del self._maps[next(iter(self._maps))]
        return st.st_size, view


def _map(path: Path, size: int) -> memoryview:
    if size == 0:
        return memoryview(b"")  # an empty file cannot be mapped
    with open(path, "rb") as f:
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
