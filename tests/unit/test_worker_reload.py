"""The producer's reload loop when a snapshot disappears before it is loaded.

The consumer keeps only the last few snapshots; with fast steps a producer can be told about v1,
then v2, and find v1 already rotated away. It must go straight to v2, not back off as after a real
failure. The engine is the fake one and `_fetch` is replaced by a stand-in that plays the
consumer's side of that race (the real fetch is covered by the integration tests)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path

import zmq.asyncio

from common import config as C
from common import wire
from common.errors import SnapshotError
from producer.engine import FakeEngine
from producer.worker import Producer


def info(version: int) -> wire.SnapshotInfo:
    return wire.SnapshotInfo(version=version, num_bytes=1, hash="0" * 64, path=f"/gone/v{version}")


class RacingProducer(Producer):
    """v1's file vanishes while it is fetched, and v2 is announced meanwhile."""

    fetched: list[int]

    async def _fetch(self, target: wire.SnapshotInfo) -> Path:
        self.fetched.append(target.version)
        if target.version == 1:
            self.state.target = info(2)
            self.state.changed.bump()
            raise SnapshotError("cannot read snapshot /gone/v1: No such file or directory")
        return self.cache


async def run_weights_loop(producer: Producer, until_version: int) -> None:
    task = asyncio.create_task(producer.weights_loop())
    try:
        async with asyncio.timeout(30):  # a safety net only: the loop should finish at once
            while producer.engine is None or producer.engine.version < until_version:
                await producer.state.changed.wait(producer.state.changed.count, 1.0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_superseded_snapshot_is_skipped_not_backed_off() -> None:
    ctx = zmq.asyncio.Context()
    try:
        producer = RacingProducer(C.Config(), ctx)
        producer.fetched = []
        producer.engine = FakeEngine(vocab_size=16, eos_token_id=15, seed=0)
        producer.state.target = info(1)
        await run_weights_loop(producer, until_version=2)
        assert producer.fetched == [1, 2]
        assert producer.engine.version == 2
        assert producer.state.counters.get("snapshots_superseded") == 1
        assert "snapshot_failures" not in producer.state.counters
    finally:
        shutil.rmtree(producer.cache, ignore_errors=True)
        ctx.destroy(linger=0)


class BrokenProducer(Producer):
    """Every fetch fails: a real failure, counted, and the engine keeps its weights."""

    fetched: list[int]

    async def _fetch(self, target: wire.SnapshotInfo) -> Path:
        self.fetched.append(target.version)
        if target.version == 3:
            raise SnapshotError("hash mismatch")
        return self.cache


async def test_failed_snapshot_is_counted_and_a_newer_one_taken_without_waiting() -> None:
    ctx = zmq.asyncio.Context()
    try:
        producer = BrokenProducer(C.Config(), ctx)
        producer.fetched = []
        producer.engine = FakeEngine(vocab_size=16, eos_token_id=15, seed=0)
        producer.state.target = info(3)
        task = asyncio.create_task(producer.weights_loop())
        async with asyncio.timeout(30):
            while "snapshot_failures" not in producer.state.counters:
                await producer.state.changed.wait(producer.state.changed.count, 0.05)
        assert producer.engine.version != 3
        producer.state.target = info(4)  # announced during the back-off
        producer.state.changed.bump()
        async with asyncio.timeout(30):
            while producer.engine.version != 4:
                await producer.state.changed.wait(producer.state.changed.count, 1.0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert producer.fetched[0] == 3
        assert producer.fetched[-1] == 4
        assert producer.state.counters["snapshot_failures"] >= 1
    finally:
        shutil.rmtree(producer.cache, ignore_errors=True)
        ctx.destroy(linger=0)


class LoadingProducer(Producer):
    """Every announced snapshot loads (the engine is the fake one)."""

    async def _fetch(self, target: wire.SnapshotInfo) -> Path:
        return self.cache


async def test_a_resumed_consumer_at_a_lower_version_replaces_the_weights_we_hold() -> None:
    """The consumer died after publishing v12 and resumed from its v10 checkpoint: the producer
    must drop v12 (another lineage), take v10 although it is lower, and start no lease before."""
    ctx = zmq.asyncio.Context()
    producer = LoadingProducer(C.Config(), ctx)
    try:
        producer.engine = FakeEngine(vocab_size=16, eos_token_id=15, seed=0)
        assert not producer._on_status(wire.Status("run-0", 12, info(12)))
        await run_weights_loop(producer, until_version=12)
        assert producer._state_name() == "idle"

        # The new incarnation answers before it has published anything.
        assert producer._on_status(wire.Status("run-1", 10, None))
        assert producer.state.target is None
        assert producer._state_name() == "loading"  # v12 is not usable for run-1's leases

        # Its first snapshot, v10, is lower than what the engine holds: it is taken anyway.
        assert not producer._on_status(wire.Status("run-1", 10, info(10)))
        assert producer.state.target == info(10)
        task = asyncio.create_task(producer.weights_loop())
        try:
            async with asyncio.timeout(30):
                while producer.engine.version != 10:
                    await producer.state.changed.wait(producer.state.changed.count, 1.0)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert producer.state.weights_run == "run-1"
        assert producer._state_name() == "idle"
    finally:
        shutil.rmtree(producer.cache, ignore_errors=True)
        ctx.destroy(linger=0)


async def test_same_version_from_a_new_incarnation_is_reloaded() -> None:
    """v12 of a resumed run is not v12 of the run that died (training diverged after the
    checkpoint): equal version numbers must not skip the reload."""
    ctx = zmq.asyncio.Context()
    producer = LoadingProducer(C.Config(), ctx)
    try:
        producer.engine = FakeEngine(vocab_size=16, eos_token_id=15, seed=0)
        producer._on_status(wire.Status("run-0", 12, info(12)))
        await run_weights_loop(producer, until_version=12)
        assert producer._on_status(wire.Status("run-1", 12, info(12)))
        assert producer._state_name() == "loading"
        task = asyncio.create_task(producer.weights_loop())
        try:
            async with asyncio.timeout(30):
                while producer.state.weights_run != "run-1":
                    await producer.state.changed.wait(producer.state.changed.count, 1.0)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert producer.state.counters["reloads"] == 2
    finally:
        shutil.rmtree(producer.cache, ignore_errors=True)
        ctx.destroy(linger=0)
