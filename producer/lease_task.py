"""One lease's task (`lease-<id>`, on the producer's event loop): wait for weights good enough,
sample its G completions, score them, hand the group to the outbox.

`LeaseRunner.run(session, lease)`: a training lease starts only once the loaded weights are at
least its `min_version` (the staleness bound by construction) and come from the consumer's
current run; an eval lease arrives pinned (producer/pins.py) and starts at once with the
weights it names, unpinned when done. Every lease of a run samples with its own seed
(`lease_seed`), so whichever producer takes it, the same lease of the same run samples the same
completions from the same weights. `busy_s` counts the time with at least one lease generating
or scoring. In a multi-turn run (`Session.episodes`) a lease samples G episodes instead of G
completions (producer/episodes/loop.py), each scored by its environment or, when the environment
leaves it to them, by the run's reward functions; an episode its environment failed scores 0 and
is never trained (the consumer leaves it out: consumer/train/batching.py).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from common import wire
from producer.engines.base import Completion
from producer.episodes.loop import Episode, run_episodes, score_episodes
from producer.groups import group_of, sampling_params
from producer.session import Session
from producer.stall import Stall
from producer.state import State


def lease_seed(run_seed: int, lease_id: int) -> int:
    """The sampling seed of a lease: whichever producer takes it, the same lease of the same run
    samples the same completions from the same weights (what makes a synchronous run, and the
    prompts and seeds of an asynchronous one, repeatable)."""
    return int(np.random.SeedSequence([run_seed, lease_id]).generate_state(1)[0]) & ((1 << 30) - 1)


class LeaseRunner:
    """The lease tasks of one producer run: their state's counters, the running tasks by lease
    id (`tasks`), the time some lease was busy."""

    def __init__(self, state: State, *, run_seed: int, stall: Stall, started: float) -> None:
        self.state, self.run_seed, self.stall = state, run_seed, stall
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.num_active, self.busy_since = 0, started

    async def run(self, session: Session, lease: wire.Lease) -> None:
        """Sample, score and send `lease`'s group (module docstring)."""
        engine, codec, state = session.engine, session.codec, self.state
        evaluation = lease.eval_version >= 0
        busy = False
        try:
            t0 = time.perf_counter()
            # The staleness bound, by construction; and never weights of a consumer incarnation
            # that has been replaced (a resume may have rolled the versions back).
            while not evaluation and (
                engine.version < lease.min_version or state.weights_run != state.run_id
            ):
                await state.changed.wait(state.changed.count, 1.0)
            await self.stall.wait()
            self.busy(+1)
            busy = True
            params = sampling_params(
                session.spec,
                lease,
                seed=lease_seed(self.run_seed, lease.lease_id),
                stop_ids=codec.stop_ids,
            )
            completions: list[Completion] | list[Episode]
            if session.episodes is None:
                prompt_ids = codec.encode(lease.messages or lease.prompt)
                completions = sampled = await engine.generate(prompt_ids, params)
                scored = await session.rewards.score_group(lease, sampled)
            else:
                prompt_ids, episodes = await run_episodes(
                    engine,
                    session.episodes.renderer,
                    session.episodes.runner,
                    lease=lease,
                    spec=session.episodes.spec,
                    params=params,
                    count=state.count,
                )
                scored = await score_episodes(session.rewards, lease, episodes)
                completions = episodes
            group = group_of(
                state.producer_id,
                lease,
                prompt_ids,
                completions,
                scored,
                temperature=params.temperature,
                gen_s=time.perf_counter() - t0,
            )
            await session.outbox.send(group)
            state.count("eval_groups_sent" if evaluation else "groups_sent")
            state.count("tokens_generated", group.num_tokens)
            state.count("generate_s", group.gen_s)
        finally:
            if busy:
                self.busy(-1)
            if evaluation:
                state.pins -= 1
            self.tasks.pop(lease.lease_id, None)
            state.in_flight.discard(lease.lease_id)
            state.changed.bump()

    def busy(self, delta: int) -> None:
        """Track time with at least one lease generating or scoring (counter busy_s); 0 accounts
        the interval in progress."""
        now = time.monotonic()
        if self.num_active > 0:
            self.state.count("busy_s", now - self.busy_since)
        self.busy_since = now
        self.num_active += delta
