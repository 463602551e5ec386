"""The consumer's model on a producer's host that has no copy of it: fetched once, checked.

A producer whose model directory (`--model`, else the consumer's `model.path` as announced)
is not on this host fetches the files the run spec lists (`wire.RunSpec.model_files`: the
weights, config and tokenizer files, consumer/snapshots/base_model.py) from the consumer's data
socket, one chunk after another, each file checked against its BLAKE3 digest before it counts,
into `~/.cache/asyncgrpo/models/DIGEST` (DIGEST: of the listing, so another model or another
version of the files is another directory). The directory is written under a temporary name and
renamed into place: an interrupted fetch leaves nothing that looks whole, and the next run on
this host with the same files takes it as it is. Progress goes to the log every 10 s and at
each tenth of the bytes (common/progress.py). A file that does not match its digest, or a
consumer that stops answering, is a `ConfigError` with one line (the producer exits 2).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import zmq.asyncio

from common import wire
from common.errors import ConfigError, SnapshotError
from common.net.keys import Keys
from common.progress import Counter
from common.weights import snapshot as snap
from producer.control import Rejected
from producer.fetch.chunk_client import ChunkClient

log = logging.getLogger("asyncgrpo.producer")
PREFIX = "model/"  # a `file_chunk_req`'s file naming one of them (as the consumer serves it)
CHUNK_BYTES = 4 << 20  # asked per request (the consumer may send less)
TIMEOUT_S = 60.0  # for one chunk


def cache_root() -> Path:
    return Path.home() / ".cache" / "asyncgrpo" / "models"


def directory_for(files: tuple[wire.ModelFile, ...], root: Path | None = None) -> Path:
    """Where the files of this listing live on this host (module docstring)."""
    listed = "\n".join(f"{f.name} {f.num_bytes} {f.hash}" for f in files)
    return (root or cache_root()) / snap.hash_bytes(listed.encode())[:20]


async def fetch_model(
    ctx: zmq.asyncio.Context,
    files: tuple[wire.ModelFile, ...],
    *,
    data_endpoint: str,
    keys: Keys | None,
    max_message_bytes: int,
    root: Path | None = None,
) -> Path:
    """The local directory of the consumer's model: already here, or fetched now."""
    target = directory_for(files, root)
    if (target / "config.json").is_file():
        return target
    _check_names(files)
    total = sum(f.num_bytes for f in files)
    log.info(
        "this host has no copy of the consumer's model: fetching its %d files (%.1f MB) from "
        "the consumer into %s",
        len(files),
        total / 1e6,
        target,
    )
    unit, scale = ("MB", 10**6) if total >= 10**7 else ("kB", 1000)
    counter = Counter("fetching the model", total // scale, lambda t: log.info("%s", t), unit=unit)

    def said(done: int) -> None:
        counter(done // scale)

    client = ChunkClient(ctx, data_endpoint, keys=keys, max_message_bytes=max_message_bytes)
    tmp = await asyncio.to_thread(_scratch, target)
    try:
        done = 0
        for f in files:
            done = await _fetch_file(client, f, tmp / f.name, done, said)
        await asyncio.to_thread(_into_place, tmp, target)
    finally:
        client.close()
        await asyncio.to_thread(shutil.rmtree, tmp, True)
    log.info("fetched the consumer's model into %s", target)
    return target


def _scratch(target: Path) -> Path:
    """A fresh directory beside `target` to fetch into."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))


def _into_place(tmp: Path, target: Path) -> None:
    """`tmp` renamed to `target`, readable like pip's files (mkdtemp makes it 0700)."""
    tmp.chmod(0o755)
    try:
        os.rename(tmp, target)
    except OSError:  # another producer of this host got there first: theirs is as good
        if not (target / "config.json").is_file():
            raise


async def _fetch_file(
    client: ChunkClient, f: wire.ModelFile, path: Path, done: int, said: Callable[[int], None]
) -> int:
    """Write `f` to `path` chunk by chunk and check it (file work on a thread: the event loop
    keeps the heartbeats going); the bytes done so far after it."""
    out = await asyncio.to_thread(path.open, "wb")
    with out:
        offset = 0
        while offset < f.num_bytes:
            request = wire.FileChunkRequest(
                req=0, version=-1, file=PREFIX + f.name, offset=offset, max_bytes=CHUNK_BYTES
            )
            try:
                chunk = await client.chunk(request, timeout_s=TIMEOUT_S)
            except (TimeoutError, Rejected) as exc:
                raise ConfigError(
                    f"fetching the consumer's model file {f.name} at byte {offset} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            if not chunk.data:
                break  # the file is shorter than listed: the digest check says so
            await asyncio.to_thread(out.write, chunk.data)
            offset += len(chunk.data)
            said(done + offset)
    try:
        await asyncio.to_thread(
            snap.verify_file, path, expected_hash=f.hash, expected_bytes=f.num_bytes
        )
    except SnapshotError as exc:
        raise ConfigError(
            f"the consumer's model file {f.name} fetched does not match the run spec: {exc}"
        ) from None
    return done + f.num_bytes


def _check_names(files: tuple[wire.ModelFile, ...]) -> None:
    """Every name is a plain file name (no directory, nothing hidden): the listing comes from
    the consumer, but a path is never built from what a peer says without looking."""
    for f in files:
        if not f.name or f.name != Path(f.name).name or f.name.startswith("."):
            raise ConfigError(f"the run spec lists a model file with a bad name: {f.name[:80]!r}")
