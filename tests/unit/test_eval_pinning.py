"""A producer samples an eval lease with exactly the weights it names (producer/pins.py,
producer/weights.py): no reload starts while the eval group is being sampled, and an eval lease
for weights it no longer holds is given back unsampled with the next lease request.

The producer's own asyncio tasks run (the weights keeper and the lease task) with the fake
engine gated by the test, so "during the group" is a state the test holds, not a race; the
weights keeper's `fetch` is replaced as in test_worker_reload.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import zmq
import zmq.asyncio
from test_worker_reload import ScriptedProducer, info

from common import config as C
from common import wire
from consumer.server.wire_terms import run_spec
from producer.engines.base import Completion, SamplingParams
from producer.engines.fake import FakeEngine
from producer.outbox import Outbox
from producer.pins import pin_lease
from producer.rewards.scoring import FakeRewards
from producer.session import Session
from producer.tokenizer import PromptCodec


class GatedEngine(FakeEngine):
    """The fake engine; `generate` waits for `gate` and every call and load is logged."""

    def __init__(self) -> None:
        super().__init__(vocab_size=16, eos_token_id=15, seed=0)
        self.gate = asyncio.Event()
        self.events: list[tuple[str, int]] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        self.events.append(("start", self.version))
        await self.gate.wait()
        out = await super().generate(prompt_ids, params)
        self.events.append(("end", self.version))
        return out

    async def load_weights(self, directory: Path, version: int) -> None:
        self.events.append(("load", version))
        await super().load_weights(directory, version)


def eval_lease(lease_id: int, version: int) -> wire.Lease:
    return wire.Lease(lease_id, 0, version, version, "1+1=", "2", (), "", eval_version=version)


async def wait_until(producer: ScriptedProducer, done) -> None:
    async with asyncio.timeout(30):  # a safety net only
        while not done():
            await producer.state.changed.wait(producer.state.changed.count, 0.05)


async def test_no_reload_starts_while_an_eval_group_is_sampled_and_a_stale_one_is_declined():
    ctx = zmq.asyncio.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind("inproc://groups")
    push = ctx.socket(zmq.PUSH)
    push.connect("inproc://groups")
    producer = ScriptedProducer(C.Config(), ctx)
    engine = GatedEngine()
    spec = run_spec(C.apply_overrides(C.Config(), ["eval.samples_per_prompt=3"]), vocab_size=16,
                    model="")  # fmt: skip
    session = producer.session = Session(
        spec=spec, engine=engine, codec=PromptCodec(None, "raw", vocab_size=16),
        rewards=FakeRewards(run_seed=0, p=0.5), outbox=Outbox(push, resend_after_s=60.0),
    )  # fmt: skip
    producer.state.run_id = producer.state.weights_run = "r"
    await engine.load_weights(producer.weights.cache, 0)
    weights = asyncio.create_task(producer.weights.keep_loaded(engine))
    try:
        lease = eval_lease(1, 0)
        assert pin_lease(producer.state, engine.version, lease)
        task = asyncio.create_task(producer.leases.run(session, lease))
        await wait_until(producer, lambda: ("start", 0) in engine.events)
        producer.state.target = info(1)  # a newer snapshot, announced mid-group
        producer.state.changed.bump()
        await wait_until(producer, lambda: producer.fetched == [1])
        assert engine.version == 0  # fetched, but not loaded: the group is pinned to v0
        assert ("load", 1) not in engine.events
        engine.gate.set()
        await task
        await wait_until(producer, lambda: engine.version == 1)
        assert engine.events == [("load", 0), ("start", 0), ("end", 0), ("load", 1)]
        group = wire.decode(await pull.recv(), wire.Limits())
        assert isinstance(group, wire.Group)
        assert group.evaluation
        assert (group.behavior_version, len(group.token_versions), group.group_size) == (0, 0, 3)
        assert producer.state.pins == 0

        assert not pin_lease(
            producer.state, engine.version, eval_lease(2, 0)
        )  # v0 is gone: given back
        assert producer.state.declined == [2]
        assert producer.state.counters["eval_leases_declined"] == 1
    finally:
        weights.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await weights
        producer.weights.close()
        ctx.destroy(linger=0)


def test_the_round_pin_holds_the_weights_while_the_round_leases_for_them():
    from producer.pins import eval_room, round_pin
    from producer.state import State

    state = State("p", run_id="r", weights_run="r")
    state.eval_round = 5
    round_pin(state, 4)  # another version: nothing to hold
    assert (state.round_pinned, state.pins, eval_room(state, 8)) == (False, 0, 0)
    round_pin(state, 5)
    assert (state.round_pinned, state.pins, eval_room(state, 8)) == (True, 1, 8)
    state.pins += 3  # three eval groups in flight
    assert eval_room(state, 8) == 5
    round_pin(state, 5)  # taken once
    assert state.pins == 4
    state.eval_round = -1  # the consumer has leased the whole round
    round_pin(state, 5)
    assert (state.round_pinned, state.pins) == (False, 3)
    state.eval_round, state.loading = 6, True
    round_pin(state, 6)  # a reload is running: no pin
    assert not state.round_pinned
    state.eval_round, state.eval_from, state.loading = -1, 6, False  # a round without a version
    round_pin(state, 5)
    assert not state.round_pinned  # too old to give it one
    round_pin(state, 7)
    assert state.round_pinned  # 7 may: it holds 7 and asks for the round


def test_eval_slots_hold_as_many_completions_as_the_training_slots():
    from common.config.evaluation import MAX_EVAL_SLOTS, eval_slots

    assert eval_slots(24, 8, 1) == 192  # greedy prompts: the round in one batch, not 8 waves
    assert eval_slots(4, 8, 4) == 8
    assert eval_slots(4, 8, 8) == eval_slots(4, 8, 16) == 4  # never fewer than the groups
    assert eval_slots(200, 16, 1) == MAX_EVAL_SLOTS


async def test_a_producer_holding_the_round_asks_for_its_eval_slots_beside_its_training_slots():
    """The lease request of a producer that holds the round's version names `eval_slots`
    (G = 8 completions per training lease, k = 1 per eval lease, 4 training slots: 32)."""
    from test_worker_reload import scripted_producer

    async with scripted_producer() as producer:
        session = producer.session
        assert session is not None
        producer.cfg = C.apply_overrides(C.Config(), ["producer.max_in_flight=4"])
        assert (session.spec.group_size, session.spec.eval_samples) == (8, 1)
        await session.engine.load_weights(producer.weights.cache, 5)
        state = producer.state
        state.run_id = state.weights_run = "r"
        state.target, state.eval_round = info(5), 5
        asked: list[wire.LeaseRequest] = []

        async def request_status(msg, timeout_s=0.0):
            asked.append(msg)
            state.finished = True  # one request is all this test needs
            return None

        producer.request_status = request_status  # type: ignore[method-assign]
        async with asyncio.TaskGroup() as tg:
            await producer.lease_loop(tg, session)
        assert [(m.max_leases, m.max_eval_leases) for m in asked] == [(4, 32)]
