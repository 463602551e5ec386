"""Snapshots over the network through the consumer's fetch plans (real sockets, real files): a
relay serves the next fetcher, deltas apply only on exactly their base, a late joiner catches up,
and a hostile relay (wrong bytes, short chunks, silence) never gets a byte into the result."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch
import zmq
import zmq.asyncio

from common import chunk_manifest as cm
from common import config as C
from common import snapshot as snap
from common import wire
from consumer.server.prompts import make_source
from consumer.server.server import Server, run_spec
from consumer.snapshots.fetch_files import FetchFiles
from consumer.snapshots.publisher import Publisher
from producer.control import ControlClient
from producer.fetch.fetcher import Fetcher, Held
from producer.fetch.relay import Relay

CHUNK = 64 << 10
MAX_MESSAGE = 1 << 20


class Consumer:
    """A consumer's network thread and a publisher announcing to it (anchors every 10)."""

    def __init__(self, run_dir: Path, *, fanout: int) -> None:
        self.cfg = C.override(
            C.Config(),
            {
                "net.control_port": 0,
                "snapshot.chunk_mib": CHUNK / (1 << 20),
                "snapshot.fanout": fanout,
            },
        )
        self.ctx = zmq.Context()
        spec = run_spec(self.cfg, vocab_size=32, model="")
        self.server = Server(
            self.cfg, self.ctx, prompts=make_source(self.cfg.task, seed=0), spec=spec,
            run_dir=run_dir, keys=None,
        )  # fmt: skip
        self.server.start()
        self.infos: dict[int, wire.SnapshotInfo] = {}
        dist = FetchFiles(chunk_bytes=CHUNK, anchor_every=10, max_ratio=0.5)
        self.publisher = Publisher(
            run_dir / "snapshots", None, keep_last=10, fetch_files=dist,
            on_published=self._published,
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
        self.server.stop()
        self.ctx.destroy(linger=0)


@pytest_asyncio.fixture
async def consumer(tmp_path: Path, request) -> AsyncIterator[Consumer]:
    c = Consumer(tmp_path / "run", fanout=getattr(request, "param", 1))
    try:
        yield c
    finally:
        c.close()


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


async def test_a_producer_that_holds_a_version_relays_it_to_the_next(consumer, tmp_path):
    info = consumer.publish(0)
    async with (
        fetcher_of(consumer, "a", relay=True) as a,
        fetcher_of(consumer, "b", relay=True) as b,
    ):
        first = await a.fetch(info, tmp_path / "a", held=None)
        second = await b.fetch(info, tmp_path / "b", held=None)
        assert same_as(info, tmp_path / "a")
        assert same_as(info, tmp_path / "b")
        assert (first.file, first.bad_sources) == ("weights", [])
        assert a.counters.get("chunks_from_consumer") == 13
        assert b.counters.get("chunks_from_relay") == 13  # every chunk from a, none from us
        assert "chunks_from_consumer" not in b.counters
        assert a.relay is not None
        assert a.relay.counters["relay_bytes_served"] == info.num_bytes
        assert second.num_bytes == info.num_bytes
    counters = consumer.counters()
    assert counters["fetch_from_consumer"] == 1
    assert counters["fetch_from_relay"] == 1
    assert counters["fetch_ok"] == 2


async def test_a_producer_on_the_base_version_takes_the_delta(consumer, tmp_path):
    v0 = consumer.publish(0)
    v1 = consumer.publish(1)
    assert cm.read_chunks(Path(v1.path).parent).delta_base == 0
    async with fetcher_of(consumer, "a", relay=False) as a:
        await a.fetch(v0, tmp_path / "v0", held=None)
        outcome = await a.fetch(v1, tmp_path / "v1", held=held(v0, tmp_path / "v0"))
    assert outcome.file == "delta"
    assert outcome.num_bytes < v1.num_bytes / 10
    assert same_as(v1, tmp_path / "v1")
    assert a.counters["deltas_applied"] == 1


async def test_a_delta_on_the_wrong_base_is_refused_and_the_full_weights_taken(consumer, tmp_path):
    v0 = consumer.publish(0)
    v1 = consumer.publish(1)
    other = tmp_path / "other"
    other.mkdir()
    wrong = bytearray(read(v0.path))
    wrong[-1] ^= 1  # claims to be v0, holds other bytes
    (other / snap.WEIGHTS_FILE).write_bytes(bytes(wrong))
    async with fetcher_of(consumer, "a", relay=False) as a:
        outcome = await a.fetch(
            v1, tmp_path / "v1", held=Held(0, other / snap.WEIGHTS_FILE, snap.hash_bytes(wrong))
        )
    assert outcome.file == "weights"
    assert a.counters["delta_refused"] == 1
    assert same_as(v1, tmp_path / "v1")
    assert not list((tmp_path / "v1").glob("*.part"))


async def test_a_late_joiner_takes_the_newest_weights_then_follows_by_deltas(consumer, tmp_path):
    for v in range(4):
        consumer.publish(v)
    late = consumer.infos[3]
    async with fetcher_of(consumer, "late", relay=False) as f:
        first = await f.fetch(late, tmp_path / "v3", held=None)
        v4 = consumer.publish(4)
        then = await f.fetch(v4, tmp_path / "v4", held=held(late, tmp_path / "v3"))
        # one that fell behind (holds v1; v4's delta is on v3) takes the full weights
        await f.fetch(consumer.infos[1], tmp_path / "v1", held=None)
        behind = await f.fetch(v4, tmp_path / "v4b", held=held(consumer.infos[1], tmp_path / "v1"))
    assert (first.file, then.file, behind.file) == ("weights", "delta", "weights")
    assert same_as(v4, tmp_path / "v4")
    assert same_as(v4, tmp_path / "v4b")


async def hostile_relay(
    mode: str, info: wire.SnapshotInfo, bound: asyncio.Future[str], ctx: zmq.asyncio.Context
) -> None:
    """A ROUTER that answers chunk requests with wrong bytes, short chunks, or nothing."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    bound.set_result(f"tcp://127.0.0.1:{port}")
    data = read(info.path)
    try:
        while True:
            identity, raw = await sock.recv_multipart()
            msg = wire.decode(raw)
            assert isinstance(msg, wire.FileChunkRequest)
            chunk = data[msg.offset : msg.offset + msg.max_bytes]
            if mode == "stalled":
                continue
            if mode == "wrong_bytes":
                chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
            if mode == "truncated":
                chunk = chunk[:-1]
            reply = wire.Chunk(msg.req, msg.version, msg.offset, len(data), chunk)
            await sock.send_multipart([identity, *wire.encode_chunk(reply)])
    finally:
        sock.close(linger=0)


@pytest.mark.parametrize("mode", ["wrong_bytes", "truncated", "stalled"])
async def test_a_hostile_relay_is_dropped_reported_and_the_fetch_completes(
    consumer, tmp_path, mode
):
    info = consumer.publish(0)
    ctx = zmq.asyncio.Context()
    bound: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    relay_task = asyncio.create_task(hostile_relay(mode, info, bound, ctx))
    try:
        endpoint = await bound
        # The hostile producer registers, claims to relay, and reports v0 done.
        async with fetcher_of(consumer, "evil", relay=False) as evil:
            source = wire.Source(endpoint, "")
            plan = await evil.control.request(
                wire.FetchRequest(0, "evil", 0, -1, "", source), timeout_s=10
            )
            assert isinstance(plan, wire.FetchPlan)
            await evil.control.request(
                wire.FetchDone(0, "evil", 0, "weights", True, info.num_bytes, (), True),
                timeout_s=10,
            )
            async with fetcher_of(consumer, "honest", relay=False, relay_timeout_s=0.5) as f:
                outcome = await f.fetch(info, tmp_path / "got", held=None)
        assert same_as(info, tmp_path / "got")
        assert outcome.bad_sources == [wire.BadSource(endpoint, mode)]
        assert f.counters[f"bad_source.{mode}"] == 1
        assert f.counters["chunks_from_consumer"] == 13
        assert "chunks_from_relay" not in f.counters  # no byte of the relay's was taken
        counters = consumer.counters()
        assert counters[f"fetch_bad_source.{mode}"] == 1
        assert counters["fetch_from_relay"] == 1
    finally:
        relay_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay_task
        ctx.destroy(linger=0)


@pytest.mark.parametrize("consumer", [1], indirect=True)
async def test_the_consumer_makes_a_fetcher_wait_while_a_relay_is_on_its_way(consumer, tmp_path):
    info = consumer.publish(0)
    async with fetcher_of(consumer, "a", relay=True) as a:
        assert a.relay is not None
        first = await a.control.request(
            wire.FetchRequest(0, "a", 0, -1, "", a.relay.source), timeout_s=10
        )
        async with fetcher_of(consumer, "b", relay=False) as b:
            waiting = await b.control.request(
                wire.FetchRequest(0, "b", 0, -1, "", None), timeout_s=10
            )
            assert isinstance(first, wire.FetchPlan)
            assert first.sources == (wire.Source("", ""),)
            assert isinstance(waiting, wire.FetchPlan)
            assert (waiting.sources, waiting.chunk_hashes) == ((), b"")
            assert waiting.wait_s > 0
            # a finishes (and relays): b's fetch now goes to a
            fetch_b = asyncio.create_task(b.fetch(info, tmp_path / "b", held=None))
            await a.fetch(info, tmp_path / "a", held=None)
            await fetch_b
        assert b.counters.get("chunks_from_relay") == 13
        assert same_as(info, tmp_path / "b")


async def test_a_held_file_pruned_meanwhile_means_the_full_weights(consumer, tmp_path):
    v0 = consumer.publish(0)
    v1 = consumer.publish(1)
    async with fetcher_of(consumer, "a", relay=False) as a:
        outcome = await a.fetch(v1, tmp_path / "v1", held=held(v0, tmp_path / "gone"))
    assert outcome.file == "weights"
    assert same_as(v1, tmp_path / "v1")


async def test_a_version_whose_chunk_hashes_are_not_written_yet_makes_fetchers_wait(
    consumer, tmp_path
):
    info = consumer.publish(0)
    chunks = Path(info.path).parent / cm.CHUNKS_FILE
    kept = read(chunks)
    chunks.unlink()  # as between the announcement and the fetch files
    async with fetcher_of(consumer, "a", relay=False) as a:
        plan = await a.control.request(wire.FetchRequest(0, "a", 0, -1, "", None), timeout_s=10)
        assert isinstance(plan, wire.FetchPlan)
        assert (plan.sources, plan.chunk_hashes) == ((), b"")
        assert plan.wait_s > 0
        chunks.write_bytes(kept)
        await a.fetch(info, tmp_path / "got", held=None)
    assert same_as(info, tmp_path / "got")
