"""The pool of spawned processes that runs a producer's user code (rewards, environments), and
that is replaced whenever a job outlives its hard deadline or takes its worker down.

`WorkerPool(workers, initializer, initargs, ...)` starts `workers` processes at once (a spawn
context: a worker never inherits the producer's torch threads or CUDA state; spawn workers do
inherit `sys.path`), each running `initializer(*initargs)` first; `ready` is done once a worker
has started (imports included). `await pool.run(fn, *args, deadline_s=...)` is `fn(*args)` in a
worker, or what ended it:
- `"timeout"`: the round trip outlived `deadline_s` (stuck in C code, or blocking SIGALRM): the
  pool's processes are killed (`kill_pool`) and a new pool started;
- `"died"`: the job took its worker down (`os._exit`, a crash in an extension): likewise;
- `"closed"`: the pool was closed (`close()`) before or while the job ran.
A job first waits for the pool's workers to start (at most `POOL_START_S`): its deadline
measures its own work, not a worker's start. A job whose pool another job's failure replaced
is tried once more on the new pool. Each replacement is logged (`section: why; restarting the
WORKERS pool`) and counted in `num_restarts`. Used by producer/rewards/runner.py and
producer/episodes/runner.py, which bound how many jobs are in the pool at once.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Literal, TypeVar

log = logging.getLogger("asyncgrpo.producer")
POOL_START_S = 60.0  # longest wait for a new pool's first worker (spawn + imports, e.g. sympy)
T = TypeVar("T")
Ended = Literal["timeout", "died", "closed"]


class WorkerPool:
    """`workers` spawn processes, replaced when a job fails them (module docstring)."""

    def __init__(
        self,
        workers: int,
        initializer: Callable[..., object],
        initargs: tuple[object, ...],
        *,
        section: str,
        job: str,
        worker: str,
    ) -> None:
        """`section`, `job`, `worker`: how the log names the pool's user ("rewards"), one job
        ("a reward") and its workers ("reward")."""
        self.workers, self.initializer, self.initargs = workers, initializer, initargs
        self.section, self.job, self.worker = section, job, worker
        self.num_restarts = 0
        self.closed = False
        self.pool, self.ready = self._start()

    def _start(self) -> tuple[ProcessPoolExecutor, Future[int]]:
        """A new pool, and a future done once a worker has started (imports included)."""
        ctx = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(
            self.workers, mp_context=ctx, initializer=self.initializer, initargs=self.initargs
        )
        return pool, pool.submit(int)  # the workers start now, not on the first job

    async def run(self, fn: Callable[..., T], *args: object, deadline_s: float) -> T | Ended:
        """`fn(*args)` in a worker, or how it ended without a result (module docstring)."""
        for _ in range(2):  # a second try only if another job's failure replaced the pool
            if not self.ready.done():  # the deadline measures the job, not a worker's start
                await asyncio.to_thread(futures.wait, [self.ready], POOL_START_S)
            if self.closed:
                break
            pool = self.pool
            try:
                submitted: Future[T] = pool.submit(fn, *args)
                async with asyncio.timeout(deadline_s):
                    return await asyncio.wrap_future(submitted)
            except TimeoutError:
                self._replace(pool, f"{self.job} outlived its hard deadline")
                return "timeout"
            except BrokenProcessPool:
                if pool is self.pool:  # this job took its worker down
                    article = "an" if self.worker[:1] in "aeiou" else "a"
                    self._replace(pool, f"{article} {self.worker} worker died")
                    return "died"
        return "closed"

    def _replace(self, pool: ProcessPoolExecutor, why: str) -> None:
        if pool is not self.pool or self.closed:
            return
        log.warning("%s: %s; restarting the %s worker pool", self.section, why, self.worker)
        self.num_restarts += 1
        kill_pool(pool)
        self.pool, self.ready = self._start()

    def close(self) -> None:
        """Kill the workers now. Idempotent; a job still in flight ends `"closed"` or `"died"`
        (its caller decides what that costs)."""
        self.closed = True
        kill_pool(self.pool)


def kill_pool(pool: ProcessPoolExecutor) -> None:
    """Kill a pool's processes (a hung reward or environment does not answer a polite
    shutdown) and reap them."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # no public API before 3.14
    pool.shutdown(wait=False)  # pending futures fail with BrokenProcessPool once they are dead
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(timeout=5)
