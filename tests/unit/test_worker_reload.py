"""The producer's reload loop: snapshots rotated away, failed snapshots, consumer restarts.

The consumer keeps only the last few snapshots; with fast steps a producer can be told about v1,
then v2, and find v1 already rotated away. It must go straight to v2, not back off as after a real
failure. A consumer that resumes from an older checkpoint starts a new lineage whose versions may
be lower than (or equal to) the weights a producer holds: those weights must never be used again.
The engine is the fake one and the weights keeper's `fetch` is replaced by stand-ins that play
the consumer's side (the real fetch is covered by the integration tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
from served import fake_session

from common import config as C
from common import wire
from common.errors import ConfigError, SnapshotError, SnapshotMismatch
from producer.worker import Producer


def info(version: int) -> wire.SnapshotInfo:
    return wire.SnapshotInfo(version=version, num_bytes=1, hash="0" * 64, path=f"/gone/v{version}")


class ScriptedProducer(Producer):
    """Its weights keeper's `fetch` records each version asked for and then does what `script`
    says."""

    def __init__(self, cfg: C.Config, ctx: zmq.asyncio.Context) -> None:
        super().__init__(cfg, ctx)
        self.fetched: list[int] = []
        self.script: Callable[[Producer, int], None] = lambda producer, version: None
        self.weights.fetch = self._scripted_fetch  # type: ignore[method-assign]

    async def _scripted_fetch(self, target: wire.SnapshotInfo) -> Path:
        self.fetched.append(target.version)
        self.script(self, target.version)  # may raise SnapshotError, or announce a newer one
        return self.weights.cache


@contextlib.asynccontextmanager
async def scripted_producer() -> AsyncIterator[ScriptedProducer]:
    ctx = zmq.asyncio.Context()
    producer = ScriptedProducer(C.Config(), ctx)
    producer.session = fake_session(producer)
    try:
        yield producer
    finally:
        shutil.rmtree(producer.weights.cache, ignore_errors=True)
        ctx.destroy(linger=0)


async def run_weights_loop_until(producer: Producer, done: Callable[[], bool]) -> None:
    assert producer.session is not None
    task = asyncio.create_task(producer.weights.keep_loaded(producer.session.engine))
    try:
        async with asyncio.timeout(30):  # a safety net only: the loop should get there at once
            while not done():
                await producer.state.changed.wait(producer.state.changed.count, 0.05)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def version(producer: Producer) -> int:
    assert producer.session is not None
    return producer.session.engine.version


async def test_superseded_snapshot_is_skipped_not_backed_off() -> None:
    def vanish_v1(producer: Producer, v: int) -> None:
        if v == 1:  # v2 is announced while v1 is fetched, and v1 is rotated away
            producer.state.target = info(2)
            producer.state.changed.bump()
            raise SnapshotError("cannot read snapshot /gone/v1: No such file or directory")

    async with scripted_producer() as producer:
        producer.script = vanish_v1
        producer.state.target = info(1)
        await run_weights_loop_until(producer, lambda: version(producer) == 2)
        assert producer.fetched == [1, 2]
        assert producer.state.counters.get("snapshots_superseded") == 1
        assert "snapshot_failures" not in producer.state.counters


async def test_failed_snapshot_is_counted_and_a_newer_one_taken() -> None:
    def corrupt_v3(producer: Producer, v: int) -> None:
        if v == 3:
            raise SnapshotError("hash mismatch")

    async with scripted_producer() as producer:
        producer.script = corrupt_v3
        producer.state.target = info(3)
        await run_weights_loop_until(
            producer, lambda: "snapshot_failures" in producer.state.counters
        )
        assert version(producer) != 3  # the engine keeps the weights it had
        producer.state.target = info(4)  # announced during the back-off
        producer.state.changed.bump()
        await run_weights_loop_until(producer, lambda: version(producer) == 4)
        assert producer.fetched[0] == 3
        assert producer.fetched[-1] == 4


async def test_a_resumed_consumer_at_a_lower_version_replaces_the_weights_we_hold() -> None:
    """The consumer died after publishing v12 and resumed from its v10 checkpoint: the producer
    must drop v12 (another lineage), take v10 although it is lower, and start no lease before."""
    async with scripted_producer() as producer:
        assert not producer._on_status(wire.Status("run-0", 12, info(12)))
        await run_weights_loop_until(producer, lambda: version(producer) == 12)
        assert producer._state_name() == "idle"

        # The new incarnation answers before it has published anything.
        assert producer._on_status(wire.Status("run-1", 10, None))
        assert producer.state.target is None
        assert producer._state_name() == "loading"  # v12 is not usable for run-1's leases

        # Its first snapshot, v10, is lower than what the engine holds: it is taken anyway.
        assert not producer._on_status(wire.Status("run-1", 10, info(10)))
        assert producer.state.target == info(10)
        await run_weights_loop_until(producer, lambda: version(producer) == 10)
        assert producer.state.weights_run == "run-1"
        assert producer._state_name() == "idle"


async def test_a_producer_holding_its_version_for_an_eval_round_says_so() -> None:
    """Pinned weights (producer/pins.py) with a newer snapshot announced: "evaluating", not
    "loading" (the reload waits for the round, not for a fetch)."""
    async with scripted_producer() as producer:
        producer._on_status(wire.Status("run-0", 12, info(12)))
        await run_weights_loop_until(producer, lambda: version(producer) == 12)
        producer.state.pins = 1
        producer._on_status(wire.Status("run-0", 13, info(13)))
        assert producer._state_name() == "evaluating"
        producer.state.pins = 0
        assert producer._state_name() == "loading"


async def test_same_version_from_a_new_incarnation_is_reloaded() -> None:
    """v12 of a resumed run is not v12 of the run that died (training diverged after the
    checkpoint): equal version numbers must not skip the reload."""
    async with scripted_producer() as producer:
        producer._on_status(wire.Status("run-0", 12, info(12)))
        await run_weights_loop_until(producer, lambda: version(producer) == 12)
        assert producer._on_status(wire.Status("run-1", 12, info(12)))
        assert producer._state_name() == "loading"
        await run_weights_loop_until(producer, lambda: producer.state.weights_run == "run-1")
        assert producer.fetched == [12, 12]
        assert producer.state.counters["reloads"] == 2


async def test_weights_that_can_never_fit_the_model_end_the_producer_with_one_error() -> None:
    def wrong_model(producer: Producer, v: int) -> None:
        raise SnapshotMismatch("snapshot /s does not fit the model (wrong shape: w [4] != [8])")

    async with scripted_producer() as producer:
        producer.script = wrong_model
        producer.state.target = info(1)
        with pytest.raises(ConfigError, match=r"can never load into this producer's model \("
                           r"snapshot /s does not fit .*pass --model with a copy"):  # fmt: skip
            await run_weights_loop_until(producer, lambda: bool(producer.fetched))
        assert producer.fetched == [1]  # no retry: it cannot get better
