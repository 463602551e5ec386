"""Snapshots over the network through the consumer's fetch plans (real sockets, real files): a
relay serves the next fetcher, deltas apply only on exactly their base, a late joiner catches up,
and a hostile relay (wrong bytes, short chunks, silence) never gets a byte into the result."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import zmq
import zmq.asyncio
from fetch_consumer import Consumer, fetcher_of, held, read, same_as

from common import wire
from common.weights import chunk_manifest as cm
from common.weights import snapshot as snap
from consumer.snapshots import fanout
from producer.fetch.fetcher import Held


@pytest_asyncio.fixture
async def consumer(tmp_path: Path, request) -> AsyncIterator[Consumer]:
    c = Consumer(tmp_path / "run", fanout=getattr(request, "param", 1))
    try:
        yield c
    finally:
        c.close()


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
async def test_a_relay_still_fetching_is_given_out_and_then_fetchers_wait(consumer, tmp_path):
    info = consumer.publish(0)
    async with (
        fetcher_of(consumer, "a", relay=True) as a,
        fetcher_of(consumer, "b", relay=False) as b,
        fetcher_of(consumer, "c", relay=False) as c,
    ):
        assert a.relay is not None
        plans = [
            await f.control.request(wire.FetchRequest(0, name, 0, -1, "", relay), timeout_s=10)
            for f, name, relay in ((a, "a", a.relay.source), (b, "b", None), (c, "c", None))
        ]
        assert all(isinstance(p, wire.FetchPlan) for p in plans)
        first, second, waiting = plans
        assert first.sources == (fanout.CONSUMER,)
        assert second.sources == (a.relay.source, fanout.CONSUMER)  # a has no chunk yet
        assert (waiting.sources, waiting.chunk_hashes) == ((), b"")  # a relay is on its way
        assert waiting.wait_s > 0
        begun = asyncio.Event()
        begin = a.relay.begin

        def begin_and_tell(*args: Any) -> None:
            begin(*args)
            begun.set()

        a.relay.begin = begin_and_tell  # type: ignore[method-assign]
        readied: list[int] = []
        ready = a.relay.ready
        a.relay.ready = lambda v, f, i: (readied.append(i), ready(v, f, i))[1]  # type: ignore[method-assign]
        fetch_a = asyncio.create_task(a.fetch(info, tmp_path / "a", held=None))
        await begun.wait()  # a fetches from us: b's fetch goes to a, c waits for a slot
        await asyncio.gather(
            fetch_a,
            b.fetch(info, tmp_path / "b", held=None),
            c.fetch(info, tmp_path / "c", held=None),
        )
    assert b.counters.get("chunks_from_relay") == 13
    assert "chunks_from_consumer" not in b.counters
    assert sorted(readied) == list(range(13))  # a served each chunk once it was checked
    for name in "abc":
        assert same_as(info, tmp_path / name)
    assert consumer.counters()["fetch_waits"] >= 2


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


async def test_lora_adapters_travel_and_relay_as_snapshots_do_without_deltas(tmp_path):
    """An adapter (its file says so in its header) is fetched over the network and relayed
    chunk by chunk like any snapshot; no version carries a delta."""
    from common.weights import adapter as fmt

    spec = fmt.AdapterSpec(rank=8, alpha=16, target_modules=["q_proj"])
    consumer = Consumer(tmp_path / "run", fanout=4, adapter=fmt.AdapterHeader(spec, "ab" * 32))
    try:
        v0, v1 = consumer.publish(0), consumer.publish(1)
        assert cm.read_chunks(Path(v1.path).parent).delta_base == -1  # no delta
        assert not list((tmp_path / "run").rglob("weights.delta"))
        async with (
            fetcher_of(consumer, "a", relay=True) as a,
            fetcher_of(consumer, "b", relay=True) as b,
        ):
            await a.fetch(v0, tmp_path / "a0", held=None)
            outcome = await a.fetch(v1, tmp_path / "a1", held=held(v0, tmp_path / "a0"))
            assert outcome.file == "weights"  # never a delta
            await b.fetch(v1, tmp_path / "b1", held=None)
            assert b.counters.get("chunks_from_relay") == 13
        for directory in (tmp_path / "a1", tmp_path / "b1"):
            assert same_as(v1, directory)
            header = fmt.read_header(directory / "model.safetensors")
            assert header is not None
            assert header.base_hash == "ab" * 32
    finally:
        consumer.close()
