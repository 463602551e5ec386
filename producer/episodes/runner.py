"""The environment calls of one producer: run where rewards run, under the same kind of limits.

`EnvRunner(spec, workers=...)` resolves the environment in the producer at start (a typo fails
there, not in a worker: producer/episodes/calls.py) and runs each call:
- a built-in (`guess`: pure, bounded, trusted) in the producer itself, like the inline built-in
  rewards: no process round trip;
- a `module:function` environment in a pool of `workers` spawned processes
  (producer/worker_pool.py; a spawn context: no inherited torch threads or CUDA state), one
  call at a time per worker, each under its alarm of `episodes.timeout_s`
  (producer/episodes/calls.py). A call whose round trip outlives `timeout_s + hard_margin_s`
  (stuck in C code, or blocking SIGALRM) gets the pool killed and a new one started; a worker
  that dies (`os._exit`, a segfault) likewise. At most `workers` calls are in the pool at once
  (the others wait in asyncio), and a call's clock starts once a worker is ready.
- Simulated latency (`episodes.latency_s > 0`, stress tests): before each call, an
  `asyncio.sleep` of a Pareto draw, `latency_s * U ** (-1 / latency_alpha)`, U uniform in (0, 1]
  from a generator seeded by the call's `seed`: the same episode and turn wait the same time in
  every run. It holds no worker and no engine row.

Counters (in the producer's heartbeats: producers.json, the dashboard): `env_calls`, `env_s`
(wall seconds of calls, latency included), `env_errors` (every call that ended its episode
badly), and by kind `env_raised`, `env_timeouts`, `env_bad_returns`, `env_worker_deaths`. Every
failure is logged with the environment's name, the lease and row and why: the first of each
kind at once, then at most one line every 10 s per kind with the counts (common/net/log_limit.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import numpy as np

from common import wire
from common.net.log_limit import LogLimiter
from producer.episodes.calls import (
    BUILTINS,
    EnvCall,
    Outcome,
    call_env,
    init_env_worker,
    resolve_env,
)
from producer.episodes.contract import tools_of
from producer.worker_pool import WorkerPool

log = logging.getLogger("asyncgrpo.producer")
_COUNTED = {
    "error": "env_raised",
    "timeout": "env_timeouts",
    "bad_return": "env_bad_returns",
    "died": "env_worker_deaths",
}


def latency_s(spec: wire.EpisodeSpec, seed: int) -> float:
    """The simulated latency of one call (module docstring); 0 when off."""
    if spec.latency_s <= 0:
        return 0.0
    u = 1.0 - float(np.random.default_rng(seed).random())  # (0, 1]
    return float(spec.latency_s * u ** (-1.0 / spec.latency_alpha))


class EnvRunner:
    """Runs environment calls inline or in a pool (module docstring)."""

    def __init__(
        self,
        spec: wire.EpisodeSpec,
        *,
        workers: int,
        hard_margin_s: float = 10.0,
        inline: bool | None = None,
    ) -> None:
        """`inline`: call in this process (None: the built-ins only; True: any environment,
        without a timer: for tests and trusted code)."""
        self.spec, self.workers, self.hard_margin_s = spec, workers, hard_margin_s
        self.tools = tools_of(resolve_env(spec.env))
        self.inline = spec.env in BUILTINS if inline is None else inline
        self.counters: dict[str, float] = {}
        self._slots = asyncio.Semaphore(workers)
        self._log = LogLimiter(log)
        self._closed = False
        self._pool: WorkerPool | None = None
        if not self.inline:  # the workers start now, not on the first call
            self._pool = WorkerPool(
                workers,
                init_env_worker,
                (spec.env,),
                section="episodes",
                job="an environment call",
                worker="environment",
            )

    @property
    def num_pool_restarts(self) -> int:
        return self._pool.num_restarts if self._pool is not None else 0

    async def call(self, call: EnvCall, *, seed: int, where: str) -> Outcome:
        """One call (after its simulated latency); `where` names the lease, row, episode and
        turn in a failure's log line."""
        assert not self._closed, "call() after close()"
        t0 = time.perf_counter()
        wait = latency_s(self.spec, seed)
        if wait:
            await asyncio.sleep(wait)
        if self.inline:
            outcome = call_env(self.spec.env, call, None)
        else:
            async with self._slots:
                outcome = await self._round_trip(call)
        wall_s = time.perf_counter() - t0
        self._count("env_calls", 1)
        self._count("env_s", wall_s)
        if outcome.kind not in ("next", "end"):
            self._failed(outcome, where)
        return dataclasses.replace(outcome, wall_s=wall_s)

    def warn(self, key: str, message: str, *args: object) -> None:
        """A warning about an environment, rate-limited per `key` (the first at once)."""
        self._log.log(key, logging.WARNING, message, *args)

    def _failed(self, outcome: Outcome, where: str) -> None:
        self._count("env_errors", 1)
        self._count(_COUNTED.get(outcome.kind, "env_raised"), 1)
        self.warn(
            f"env.{outcome.kind}",
            "environment %r %s on %s: the episode ends (env_error) and is not trained "
            "(%d environment errors so far)",
            self.spec.env,
            outcome.why,
            where,
            int(self.counters["env_errors"]),
        )

    async def _round_trip(self, call: EnvCall) -> Outcome:
        assert self._pool is not None, "a pool runner"
        spec = self.spec
        deadline_s = spec.timeout_s + self.hard_margin_s
        got = await self._pool.run(call_env, spec.env, call, spec.timeout_s, deadline_s=deadline_s)
        if got == "timeout":
            why = "outlived its hard deadline (stuck in C code, or blocking SIGALRM)"
            return Outcome("timeout", state=call.state, why=why)
        if got == "died":  # this call took its worker down
            why = "took its worker process down (os._exit, a crash in an extension)"
            return Outcome("died", state=call.state, why=why)
        if got == "closed":
            return Outcome("error", state=call.state, why="not called: the producer is closing")
        return got

    def _count(self, key: str, n: float) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def close(self) -> None:
        """Stop the workers now. Idempotent; a call still in flight ends as an error."""
        self._closed = True
        if self._pool is not None:
            self._pool.close()
