"""Relays that serve a file while they fetch it (producer/fetch/relay.py, real sockets and files):
a chunk is served before the next one is here, and a request for one not here yet is answered
when it comes; a corrupt chunk from such a relay, or a relay that dies or fails mid-file, costs
its fetchers a fallback to the consumer, reported and counted, never a wrong byte."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import zmq.asyncio
from fetch_consumer import MAX_MESSAGE, Consumer, fetcher_of, read, same_as

from common import wire
from common.weights import chunk_manifest as cm
from consumer.snapshots.fanout import FanOut
from producer.control import Rejected
from producer.fetch.chunk_client import ChunkClient
from producer.fetch.relay import Relay

CB = 4096  # chunk bytes of the relay-only test


@pytest_asyncio.fixture
async def consumer(tmp_path: Path) -> AsyncIterator[Consumer]:
    c = Consumer(tmp_path / "run", fanout=1)
    try:
        yield c
    finally:
        c.close()


def write_chunk(path: Path, data: bytes, chunks: cm.ChunkHashes, index: int) -> None:
    """Chunk `index` of `data` written at its place in `path` (as the fetcher writes it)."""
    offset, size = chunks.span(index)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data[offset : offset + size], offset)
    finally:
        os.close(fd)


def serving_relay(ctx: zmq.asyncio.Context) -> tuple[Relay, asyncio.Task[None], ChunkClient]:
    """A relay on a free loopback port, its serving task, and a chunk client connected to it."""
    relay = Relay(ctx, host="127.0.0.1", port=0, keys=None, insecure=False,
                  max_message_bytes=MAX_MESSAGE)  # fmt: skip
    serving = asyncio.create_task(relay.serve())
    client = ChunkClient(ctx, relay.source.endpoint, keys=None, max_message_bytes=MAX_MESSAGE)
    return relay, serving, client


async def test_a_relay_serves_a_chunk_before_it_holds_the_next(tmp_path):
    data = os.urandom(3 * CB - 100)
    chunks = cm.chunk_hashes(data, CB)
    part = tmp_path / "model.safetensors.part"
    ctx = zmq.asyncio.Context()
    relay, serving, client = serving_relay(ctx)

    def ask(index: int) -> asyncio.Task[wire.Chunk]:
        msg = wire.FileChunkRequest(0, 7, "weights", index * CB, CB)
        return asyncio.create_task(client.chunk(msg, timeout_s=30))

    try:
        relay.expect(7)
        later = ask(1)  # asked before the relay knows the file, and before it holds chunk 1
        relay.begin(7, "weights", part, chunks)
        write_chunk(part, data, chunks, 0)
        relay.ready(7, "weights", 0)
        first = await ask(0)
        assert bytes(first.data) == data[:CB]
        assert first.total_bytes == len(data)
        assert not later.done()  # chunk 0 was served while the request for chunk 1 waits
        write_chunk(part, data, chunks, 1)
        relay.ready(7, "weights", 1)
        assert bytes((await later).data) == data[CB : 2 * CB]
        assert relay.counters["relay_requests_held"] >= 1
        last = ask(2)
        assert bytes((await ask(0)).data) == data[:CB]  # asked after 2: 2 is held by now
        relay.abort(7, "weights")  # the relay's own fetch failed: what waits is refused
        with pytest.raises(Rejected) as refused:
            await last
        assert refused.value.reason == "snapshot_gone"
        relay.settle(7)  # and once the fetch of v7 ended, nothing of it is served any more
        with pytest.raises(Rejected):
            await ask(0)
    finally:
        serving.cancel()
        client.close()
        relay.close()
        ctx.destroy(linger=0)


async def started_relay(
    consumer: Consumer, relay: Relay, a_control, info: wire.SnapshotInfo, part: Path, *,
    ready: range, corrupt: int = -1,
) -> None:  # fmt: skip
    """`relay`'s producer ("a") is given the consumer as its source and is partway through
    (chunks `ready` written and served; chunk `corrupt` flipped on its disk after its check)."""
    plan = await a_control.request(
        wire.FetchRequest(0, "a", info.version, -1, "", relay.source), timeout_s=10
    )
    assert isinstance(plan, wire.FetchPlan)
    chunks = cm.ChunkHashes(plan.num_bytes, plan.chunk_bytes, plan.chunk_hashes)
    data = bytearray(read(info.path))
    if corrupt >= 0:
        data[chunks.span(corrupt)[0]] ^= 0xFF
    relay.expect(info.version)
    relay.begin(info.version, "weights", part, chunks)
    for index in ready:
        write_chunk(part, bytes(data), chunks, index)
        relay.ready(info.version, "weights", index)


async def test_a_corrupt_chunk_from_a_relay_still_fetching_is_taken_from_the_consumer(
    consumer, tmp_path
):
    info = consumer.publish(0)
    async with fetcher_of(consumer, "a", relay=True) as a:
        assert a.relay is not None
        await started_relay(consumer, a.relay, a.control, info, tmp_path / "a.part",
                            ready=range(12), corrupt=3)  # fmt: skip
        async with fetcher_of(consumer, "b", relay=False) as b:
            outcome = await b.fetch(info, tmp_path / "b", held=None)
    assert same_as(info, tmp_path / "b")
    assert outcome.bad_sources == [wire.BadSource(a.relay.source.endpoint, "wrong_bytes")]
    assert b.counters["bad_source.wrong_bytes"] == 1
    taken = b.counters["chunks_from_relay"], b.counters["chunks_from_consumer"]
    assert sum(taken) == 13
    assert taken[1] >= 1  # chunk 3 (and the rest) from the consumer
    assert consumer.counters()["fetch_bad_source.wrong_bytes"] == 1


@pytest.mark.parametrize("how", ["dies", "fetch_fails"])
async def test_a_relay_lost_mid_file_leaves_its_fetcher_to_finish_from_the_consumer(
    consumer, tmp_path, how
):
    info = consumer.publish(0)
    async with fetcher_of(consumer, "a", relay=True) as a:
        relay = a.relay
        assert relay is not None
        await started_relay(consumer, relay, a.control, info, tmp_path / "a.part", ready=range(6))
        count = relay._count

        def lose_when_held(key: str, n: float = 1) -> None:
            count(key, n)
            if key == "relay_requests_held":  # b asked for chunk 6, not here: the relay is lost
                if how == "dies":
                    asyncio.get_running_loop().call_soon(relay.close)
                else:
                    asyncio.get_running_loop().call_soon(relay.abort, 0, "weights")

        relay._count = lose_when_held  # type: ignore[method-assign]
        async with fetcher_of(consumer, "b", relay=False, relay_timeout_s=0.5) as b:
            b.window = 1  # one chunk at a time: chunks 0-5 come from a before it is lost
            outcome = await b.fetch(info, tmp_path / "b", held=None)
            reason = "stalled" if how == "dies" else "refused"
            assert outcome.bad_sources == [wire.BadSource(relay.source.endpoint, reason)]
            assert (b.counters["chunks_from_relay"], b.counters["chunks_from_consumer"]) == (6, 7)
            assert same_as(info, tmp_path / "b")
            assert consumer.counters()[f"fetch_bad_source.{reason}"] == 1
            # the consumer no longer gives a out for this version
            plan = await b.control.request(wire.FetchRequest(0, "b", 0, -1, "", None), timeout_s=10)
            assert isinstance(plan, wire.FetchPlan)
            assert relay.source not in plan.sources


async def test_a_relay_dying_mid_file_above_a_chain_leaves_everyone_below_complete(
    consumer, tmp_path
):
    info = consumer.publish(0)
    async with (
        fetcher_of(consumer, "a", relay=True) as a,
        fetcher_of(consumer, "b", relay=True, relay_timeout_s=0.5) as b,
        fetcher_of(consumer, "c", relay=False, relay_timeout_s=0.5) as c,
    ):
        assert a.relay is not None
        assert b.relay is not None
        dead, below = a.relay, b.relay
        await started_relay(consumer, dead, a.control, info, tmp_path / "a.part", ready=range(6))
        count = dead._count

        def die_when_held(key: str, n: float = 1) -> None:
            count(key, n)
            if key == "relay_requests_held":  # b asked a for chunk 6, not there: a dies
                asyncio.get_running_loop().call_soon(dead.close)

        dead._count = die_when_held  # type: ignore[method-assign]
        begun = asyncio.Event()
        begin = below.begin

        def begin_and_tell(*args: Any) -> None:
            begin(*args)
            begun.set()

        below.begin = begin_and_tell  # type: ignore[method-assign]
        b.window = 1  # chunks 0-5 come from a before it dies
        fetch_b = asyncio.create_task(b.fetch(info, tmp_path / "b", held=None))
        await begun.wait()  # b has its plan (from a): c's goes to b
        got_c = await c.fetch(info, tmp_path / "c", held=None)
        got_b = await fetch_b
    assert got_b.bad_sources == [wire.BadSource(dead.source.endpoint, "stalled")]
    assert b.counters["chunks_from_relay"] == 6
    # b answered c's probes while it waited on a and then on us: c kept b, nothing from us
    assert got_c.bad_sources == []
    assert c.counters["chunks_from_relay"] == 13
    assert same_as(info, tmp_path / "b")
    assert same_as(info, tmp_path / "c")
    assert consumer.counters()["fetch_bad_source.stalled"] == 1


async def test_a_held_request_waits_while_the_relay_is_alive_and_not_once_it_died(tmp_path):
    data = os.urandom(3 * CB)
    chunks = cm.chunk_hashes(data, CB)
    part = tmp_path / "model.safetensors.part"
    ctx = zmq.asyncio.Context()
    relay, serving, client = serving_relay(ctx)
    idle_s = 0.2

    def ask(index: int) -> asyncio.Task[wire.Chunk]:
        msg = wire.FileChunkRequest(0, 7, "weights", index * CB, CB)
        return asyncio.create_task(client.chunk(msg, timeout_s=30, idle_s=idle_s))

    try:
        part.touch()  # as the fetcher's IncomingFile makes it, before any chunk
        relay.begin(7, "weights", part, chunks)
        held = ask(0)
        # nothing comes for many idle_s, but the relay answers probes: not stalled
        done, _ = await asyncio.wait({held}, timeout=5 * idle_s)
        assert not done
        assert relay.counters["relay_probes_answered"] >= 2
        write_chunk(part, data, chunks, 0)
        relay.ready(7, "weights", 0)
        assert bytes((await held).data) == data[:CB]
        serving.cancel()
        relay.close()  # the relay dies: silent, to probes too
        with pytest.raises(TimeoutError):
            await ask(1)
    finally:
        serving.cancel()
        client.close()
        relay.close()
        ctx.destroy(linger=0)


def test_plans_chain_relays_still_fetching_then_branch_where_it_slows_the_fewest(consumer):
    info = consumer.publish(0)  # 13 chunks: a relay still fetching takes fetchers to 26 hops
    out = FanOut(Path(info.path).parents[1], max_children=2, count=lambda key, n: None)

    def ask(name: str) -> str:
        relay = wire.Source(f"tcp://{name}:1", "")
        plan = out.plan(wire.FetchRequest(0, name, 0, -1, "", relay), 0.0)
        return plan.sources[0].endpoint

    got = [ask(f"p{i}") for i in range(28)]
    assert got[0] == ""  # the consumer sends one copy
    assert got[1:26] == [f"tcp://p{i}:1" for i in range(25)]  # each below the last
    assert got[26] == "tcp://p24:1"  # p25 is 26 hops down: a branch at the deepest with room
    assert got[27] == "tcp://p23:1"  # p24 and p25 are full or too deep
    out.done(wire.FetchDone(0, "p0", 0, "weights", True, info.num_bytes, (), True))
    assert ask("q1") == "tcp://p27:1"  # the least busy first: p27 has no fetcher yet
    assert ask("q2") == "tcp://p0:1"  # then a complete copy, among sources as busy
    out.done(wire.FetchDone(0, "p9", 0, "weights", False, 0, (), False))
    assert "tcp://p9:1" not in out._versions[0].holders["weights"]  # its fetch failed
