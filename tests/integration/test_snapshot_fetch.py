"""How a producer gets a published snapshot: the consumer's own file on this host (taken on the
writer's hash, or hashed), or a fetch over the network (real sockets)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch
import zmq.asyncio
from served import started_server

from common import config as C
from common import wire
from common.errors import SnapshotError
from common.weights import snapshot as snap
from consumer.server.server import Server
from consumer.snapshots.publisher import Publisher
from producer.worker import Producer


def publish(root: Path, version: int = 1) -> wire.SnapshotInfo:
    published: list[wire.SnapshotInfo] = []
    publisher = Publisher(root, None, keep_last=3, on_published=published.append)
    weights = {"w": torch.arange(300_000, dtype=torch.float32)}  # 600 kB in bf16
    publisher.submit(weights, version=version, step=version, dtype=torch.bfloat16)
    publisher.close()
    return published[0]


@pytest_asyncio.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Server, wire.SnapshotInfo]]:
    """A consumer's network thread serving one published snapshot; chunks of at most 64 KiB."""
    cfg = C.override(C.Config(), {"net.control_port": 0, "snapshot.chunk_mib": 1 / 16})
    with started_server(cfg, tmp_path) as (server, _):
        yield server, publish(tmp_path / "snapshots")


@contextlib.asynccontextmanager
async def producer_of(server: Server | None, *, trust: bool = True) -> AsyncIterator[Producer]:
    """A producer whose control socket talks to `server` (its reply reader running)."""
    port = server.ports["control"] if server is not None else 1
    cfg = C.override(
        C.Config(),
        {"net.connect": f"tcp://127.0.0.1:{port}", "producer.trust_local_hash": trust},
    )
    ctx = zmq.asyncio.Context()
    producer = Producer(cfg, ctx)
    reader = asyncio.create_task(producer.control.read_replies())
    try:
        async with asyncio.timeout(30):
            if server is not None:  # fetch plans are for registered producers
                await producer.register()
            yield producer
    finally:
        reader.cancel()
        await producer.close()
        ctx.destroy(linger=0)


def disown_and_corrupt(info: wire.SnapshotInfo) -> None:
    """The manifest now names another writer, and the file's last byte is flipped."""
    path = Path(info.path)
    manifest = dataclasses.replace(snap.read_manifest(path.parent), writer="another-host/boot")
    (path.parent / snap.MANIFEST_FILE).write_text(json.dumps(dataclasses.asdict(manifest)))
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def leftovers(directory: Path) -> list[Path]:
    return [*directory.rglob(snap.WEIGHTS_FILE), *directory.rglob("*.part")]


def same_inode(a: Path, b: Path) -> bool:
    return a.stat().st_ino == b.stat().st_ino


def same_bytes(a: Path, b: Path) -> bool:
    return a.read_bytes() == b.read_bytes()


async def test_a_snapshot_written_on_this_host_is_taken_on_its_manifest(tmp_path, monkeypatch):
    info = publish(tmp_path / "snapshots")
    monkeypatch.setattr(snap, "_hash_fd", lambda fd: pytest.fail("hashed again"))
    async with producer_of(None) as producer:
        directory = await producer.weights.fetch(info)
        assert directory.parent == producer.weights.cache  # pinned: the engine loads what it took
        assert same_inode(directory / snap.WEIGHTS_FILE, Path(info.path))
        assert producer.state.counters["snapshots_local_trusted"] == 1


async def test_without_trust_the_local_file_is_hashed(served):
    server, info = served
    async with producer_of(server, trust=False) as producer:
        directory = await producer.weights.fetch(info)
        assert same_inode(directory / snap.WEIGHTS_FILE, Path(info.path))
        assert producer.state.counters["snapshots_local"] == 1
        assert "snapshots_local_trusted" not in producer.state.counters


async def test_a_corrupt_local_file_is_never_taken(served):
    """Written elsewhere (the manifest names another host): the file is hashed, found corrupt,
    and the fetch over the network serves the same corrupt bytes: refused, nothing kept."""
    server, info = served
    disown_and_corrupt(info)
    async with producer_of(server) as producer:
        with pytest.raises(SnapshotError, match="hash"):
            await producer.weights.fetch(info)
        assert leftovers(producer.weights.cache) == []
