"""The runner that scores groups with the run's rewards and keeps bad reward functions from
hurting the producer.

What a reward is (the built-ins, `module:function`, and how its signature says it is called:
per completion or per group, by name with the row's prompt, answer and other columns,
positionally as `fn(completion, answer)`, sync or async): producer/rewards/calls.py. What runs
one group's calls, each under its timer: producer/rewards/worker.py.

`RewardRunner.score(completions, answer, prompt=..., columns=...)` scores one group in one round
trip to a process pool (producer/worker_pool.py; spawn context: a worker never inherits the
producer's torch threads or CUDA state; spawn workers do inherit `sys.path`). When every reward
is a bounded built-in (`INLINE`: `exact_match`, `boxed_format`: a string compare and a linear
regex on a completion of at most `sampling.max_new_tokens` tokens, which can neither hang nor
crash the process), the group is scored in the producer itself and no pool is started: the
same values, counters and log lines, without a process round trip per group (~0.8 ms of wall and
~1 ms of the producer's CPU). The reward of completion i is `sum_k weight_k * fn_k(c_i, row)`.
Invariants (besides producer/rewards/worker.py's, per call):
- A group whose round trip outlives `timeout_s * calls + hard_margin_s` (a reward stuck in C
  code, or one that blocks SIGALRM) gets the pool's processes killed and a new pool started; the
  group scores 0 and every call counts as a timeout. A worker that dies (a reward calling
  `os._exit`, a segfault) likewise costs one new pool and the group's calls count as errors.
  `calls` = rewards x completions, whether a reward is called per completion or per group.
- At most `workers` groups are in the pool at once (the rest wait in asyncio), and a group waits
  for a new pool's workers to start before its clock runs: the deadline measures its own work,
  not time queued behind other groups or a worker's start-up.
- Specs are resolved in the parent at construction, signatures included: a typo fails at
  startup, not in a worker.
- `num_calls`, `num_errors`, `num_timeouts`, `num_pool_restarts` and `contained` (the calls of
  the `code_tests` reward whose program the sandbox stopped, by reason) are cumulative counters.
- Nothing fails silently: each failed call's reason (the exception and its message, the
  value returned, the missing column, or the timeout) comes back from the worker, and the
  producer logs the first of each kind per reward at once, then at most one line every 10 s per
  kind (common/net/log_limit.py), with the counts; timeouts also say that they cost throughput. The
  counts reach the consumer in heartbeats (the dashboard, `asyncgrpo status`, summary.md).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

import numpy as np

from common import wire
from common.config import RewardSpec
from common.config.run import reward_names
from common.errors import ConfigError
from common.net.log_limit import LogLimiter
from producer.rewards.builtins import INLINE
from producer.rewards.calls import resolve
from producer.rewards.worker import Failure, RowData, Table, init_worker, score_group
from producer.worker_pool import WorkerPool

log = logging.getLogger("asyncgrpo.producer")


@dataclass(frozen=True, slots=True, eq=False)
class Scored:
    rewards: np.ndarray  # float32 [G]: the weighted sum
    parts: dict[str, np.ndarray]  # float32 [G] per reward spec (unweighted)
    num_errors: int
    num_timeouts: int
    contained: dict[str, int]  # sandboxed calls a limit ended, by reason (scored 0; not errors)
    first_error: str = ""  # the first failed call, in one line ("" when none failed)


class RewardRunner:
    """Scores groups in a pool of `workers` spawn processes, or inline when every reward is in
    `INLINE`; see the module docstring."""

    def __init__(
        self,
        specs: Sequence[RewardSpec],
        *,
        timeout_s: float,
        workers: int,
        hard_margin_s: float = 10.0,
    ) -> None:
        if not specs:
            raise ConfigError("rewards.fns needs at least one reward")
        for s in specs:
            resolve(s.fn)
            if not math.isfinite(s.weight):
                raise ConfigError(f"rewards.fns: weight of {s.fn!r} must be finite")
        assert timeout_s > 0, "config validation keeps rewards.timeout_s > 0"
        assert workers >= 1, "config validation keeps rewards.workers >= 1"
        self.specs = tuple(specs)
        self.names = reward_names([s.fn for s in self.specs])
        self.timeout_s, self.workers, self.hard_margin_s = timeout_s, workers, hard_margin_s
        self.num_calls = self.num_errors = self.num_timeouts = 0
        self.contained: dict[str, int] = {}  # sandboxed calls a limit ended, by reason
        self._slots = asyncio.Semaphore(workers)
        self._log = LogLimiter(log)
        self._closed = False
        self.inline = all(s.fn in INLINE for s in self.specs)
        self._pool: WorkerPool | None = None
        if not self.inline:  # the workers start now, not on the first group
            fns = sorted({s.fn for s in self.specs})
            self._pool = WorkerPool(
                workers, init_worker, (fns,), section="rewards", job="a reward", worker="reward"
            )

    @property
    def num_pool_restarts(self) -> int:
        return self._pool.num_restarts if self._pool is not None else 0

    async def score(
        self,
        completions: list[str],
        answer: str,
        *,
        prompt: str | list[dict[str, str]] = "",
        columns: str = "",
    ) -> Scored:
        """Score one group: G completions of one prompt, against its reference answer and the
        rest of its row (`columns`: a JSON object's text, "" = none)."""
        assert not self._closed, "score() after close()"
        calls = len(self.specs) * len(completions)
        self.num_calls += calls
        row = RowData(prompt, answer, columns)
        if calls and self.inline:
            specs = [s.fn for s in self.specs]
            table, errors, timeouts, failures, contained = score_group(
                specs, completions, row, None
            )
        elif calls:
            async with self._slots:
                table, errors, timeouts, failures, contained = await self._round_trip(
                    completions, row, calls
                )
        else:
            table, errors, timeouts, failures, contained = [[] for _ in self.specs], 0, 0, [], {}
        self.num_errors += errors
        self.num_timeouts += timeouts
        for reason, n in contained.items():
            self.contained[reason] = self.contained.get(reason, 0) + n
        self._report(failures, errors, timeouts, len(completions))
        parts = {n: np.asarray(row, np.float32) for n, row in zip(self.names, table, strict=True)}
        total = np.zeros(len(completions), np.float32)
        for spec, name in zip(self.specs, self.names, strict=True):
            total += np.float32(spec.weight) * parts[name]
        return Scored(total, parts, errors, timeouts, contained, first_error(failures))

    def _report(self, failures: list[Failure], errors: int, timeouts: int, size: int) -> None:
        """Log failed reward calls with what went wrong: the first of each (reward, kind) at
        once, then at most one line every 10 s each, saying how many were held back."""
        for spec, kind, why in failures:
            if kind == "contained":
                self._log.log(
                    f"{spec}.{kind}.{why}",
                    logging.INFO,
                    "reward %r: a completion's program was stopped by the sandbox (%s; scored 0)",
                    spec,
                    why,
                )
                continue
            self._log.log(
                f"{spec}.{kind}",
                logging.WARNING,
                "reward %r %s (scored 0; %d errors, %d timeouts in this group of %d; "
                "%d errors, %d timeouts so far)",
                spec,
                why,
                errors,
                timeouts,
                size,
                self.num_errors,
                self.num_timeouts,
            )
        if timeouts:
            self._log.log(
                "timeouts.cost",
                logging.WARNING,
                "rewards: %d calls timed out in one group, each holding a reward worker "
                "%.3g s (rewards.timeout_s): slow rewards cut this producer's throughput; "
                "raise rewards.workers or fix the reward",
                timeouts,
                self.timeout_s,
            )

    async def _round_trip(self, completions: list[str], row: RowData, calls: int) -> Table:
        zeros = [[0.0] * len(completions) for _ in self.specs]
        specs = [s.fn for s in self.specs]
        assert self._pool is not None, "a pool runner"
        deadline_s = self.timeout_s * calls + self.hard_margin_s
        got = await self._pool.run(
            score_group, specs, completions, row, self.timeout_s, deadline_s=deadline_s
        )
        if got == "timeout":
            why = "outlived its hard deadline (stuck in C code, or blocking SIGALRM)"
            return zeros, 0, calls, [(s, "timeout", why) for s in specs], {}
        if got == "died":  # this group's reward took its worker down
            why = "took its worker process down (os._exit, a crash in an extension)"
            return zeros, calls, 0, [(s, "error", why) for s in specs], {}
        if got == "closed":
            closing = [(s, "error", "not scored: the producer is closing") for s in specs]
            return zeros, calls, 0, closing, {}
        return got

    def close(self) -> None:
        """Stop the workers now (rewards are pure: there is nothing to flush). Idempotent.

        A group still in flight scores 0 with its calls counted as errors.
        """
        self._closed = True
        if self._pool is not None:
            self._pool.close()

    async def __aenter__(self) -> RewardRunner:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def first_error(failures: Sequence[Failure]) -> str:
    """The first failed call of a group in one line (`wire.Group.reward_error`): the reward and
    what went wrong, within the wire's bound; "" when none failed."""
    if not failures:
        return ""
    spec, _, why = failures[0]
    text = f"reward {spec!r} {why}"
    limit = wire.MAX_REWARD_ERROR_CHARS
    return text if len(text) <= limit else text[: limit - 3] + "..."
