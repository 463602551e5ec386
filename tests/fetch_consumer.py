"""A consumer's network thread and publisher, and registered producers' fetchers (with relays),
on real loopback sockets and real files: what the fan-out tests (tests/integration/test_fanout.py,
tests/integration/test_relay_pipelined.py) start from. Snapshots of 13 chunks of `CHUNK` bytes
(with `adapter`: files in a LoRA adapter's format).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import AsyncIterator
from pathlib import Path

import torch
import zmq
import zmq.asyncio
from served import started_server

from common import config as C
from common import wire
from common.weights import snapshot as snap
from common.weights.adapter import AdapterHeader
from consumer.snapshots.fetch_files import FetchFiles
from consumer.snapshots.publisher import Publisher
from producer.control import ControlClient
from producer.fetch.fetcher import Fetcher, Held
from producer.fetch.relay import Relay

CHUNK = 64 << 10
MAX_MESSAGE = 1 << 20


class Consumer:
    """A consumer's network thread and a publisher announcing to it (anchors every 10)."""

    def __init__(self, run_dir: Path, *, fanout: int, adapter: AdapterHeader | None = None) -> None:
        self.cfg = C.override(
            C.Config(),
            {
                "net.control_port": 0,
                "snapshot.chunk_mib": CHUNK / (1 << 20),
                "snapshot.fanout": fanout,
            },
        )
        self._served = contextlib.ExitStack()
        self.server, self.ctx = self._served.enter_context(started_server(self.cfg, run_dir))
        self.infos: dict[int, wire.SnapshotInfo] = {}
        dist = FetchFiles(chunk_bytes=CHUNK, anchor_every=10, max_ratio=0.5)
        self.publisher = Publisher(
            run_dir / "snapshots", None, keep_last=10, fetch_files=dist,
            on_published=self._published, adapter=adapter,
        )  # fmt: skip
        g = torch.Generator().manual_seed(0)
        self.weights = torch.randn(400_000, generator=g) * 0.02  # 800 kB in bf16: 13 chunks

    def _published(self, info: wire.SnapshotInfo) -> None:
        self.infos[info.version] = info
        self.server.announce_snapshot(info)

    def publish(self, version: int, *, lr: float = 1e-6) -> wire.SnapshotInfo:
        if version:
            g = torch.Generator().manual_seed(version)
            self.weights = self.weights + lr * torch.randn(self.weights.shape, generator=g)
        self.publisher.submit(
            {"w": self.weights}, version=version, step=version, dtype=torch.bfloat16
        )
        self.publisher.wait()
        return self.infos[version]

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.server.ports['control']}"

    @property
    def data_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.server.ports['data']}"

    def counters(self) -> dict[str, float]:
        return dict(self.server.view()["counters"])

    def close(self) -> None:
        self.publisher.close()
        self._served.close()


@contextlib.asynccontextmanager
async def fetcher_of(
    consumer: Consumer, name: str, *, relay: bool, relay_timeout_s: float = 5.0
) -> AsyncIterator[Fetcher]:
    """A registered producer's fetcher (and relay, serving), on its own context."""
    ctx = zmq.asyncio.Context()
    control = ControlClient(ctx, consumer.endpoint, keys=None, max_message_bytes=MAX_MESSAGE)
    tasks = [asyncio.create_task(control.read_replies())]
    server = None
    if relay:
        server = Relay(
            ctx, host="127.0.0.1", port=0, keys=None, insecure=False, max_message_bytes=MAX_MESSAGE
        )
        tasks.append(asyncio.create_task(server.serve()))
    try:
        async with asyncio.timeout(60):
            msg = wire.Register(0, name, "h", os.getpid(), "fake", -1, ())
            await control.request(msg, timeout_s=10)
            yield Fetcher(
                control, ctx, data_endpoint=consumer.data_endpoint, producer_id=name, keys=None,
                max_message_bytes=MAX_MESSAGE, relay=server, relay_timeout_s=relay_timeout_s,
                report=functools.partial(control.request, timeout_s=10),  # no state to apply to
            )  # fmt: skip
    finally:
        for task in tasks:
            task.cancel()
        control.close()
        if server is not None:
            server.close()
        ctx.destroy(linger=0)


def held(info: wire.SnapshotInfo, directory: Path) -> Held:
    return Held(info.version, directory / snap.WEIGHTS_FILE, info.hash)


def read(path: str | Path) -> bytes:
    return Path(path).read_bytes()


def same_as(info: wire.SnapshotInfo, directory: Path) -> bool:
    return (directory / snap.WEIGHTS_FILE).read_bytes() == Path(info.path).read_bytes()
