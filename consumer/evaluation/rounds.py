"""Evaluation during training through the producers: eval rounds and their leases, a pure state
machine on the network thread (no sockets, no clocks of its own; `now` is passed).

The design (docs/observability.md, "Evaluation during training"): producers keep only the
newest weights, so an evaluation of version v can only be sampled by a producer that holds v.
- `schedule(v)`: a snapshot of version v was published and v crossed a multiple of
  `eval.every_steps` (version 0, the starting model, first; the run's last version, `run.steps`,
  always: the learner waits for that round before its last metrics line, up to
  `eval.final_wait_s`, consumer/evaluation/__init__.py `await_last_round`): a round of the
  held-out prompts `0 .. P-1` begins. Its version is fixed by its first grant: the version of
  the first producer that asks holding v or newer (v itself unless producers skipped it while
  reloading: then the round evaluates that newer version, says so in `eval_version` and counts
  `eval_rounds_retargeted`). A round that still had prompts to lease is closed: those prompts
  are skipped and counted (`eval_prompts_skipped`); the newest round has them all.
- `grant`: eval leases go first (consumer/server/control.py asks here before the training
  ledger), and only to a producer whose lease request says it holds exactly v. The producer pins
  those weights while it samples the group (producer/worker.py: no reload starts while an eval
  group of it is in flight) and sends it with `Group.evaluation` set, all of it sampled with v.
  If it has moved on by the time the lease reaches it, it gives the lease back unsampled
  (`LeaseRequest.declined`): the prompt goes back to its round.
- Once a newer snapshot is out and no producer still reports holding v, nobody can sample v
  again (`close_unreachable`): the round's unleased prompts are skipped and counted.
- A round whose every prompt was answered is a result (`take_results`: mean reward, pass@1,
  pass@k, mean completion length); one that ends with prompts skipped is counted as skipped
  (`eval_rounds_skipped`), never reported as if whole.

Invariants:
- Every eval lease ends as exactly one of answered, declined, expired (timeout, its producer
  gone, or re-registered without it): `balance()` checks issued == answered + declined +
  expired + open. Eval leases live only here: never in the training ledger (consumer/server/
  leases.py), never in the learner's queue, never trained; their ids carry `EVAL_BIT`.
- Every held-out prompt of a round is answered, or skipped and counted.
- Acks: an answered group is acked `wire.EVALUATED`; a late or unknown one `expired` (its
  producer forgets it).
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common import wire
from common.task.pass_at_k import mean_pass_at_k

log = logging.getLogger("asyncgrpo.consumer")
EVAL_BIT = 1 << 62  # set in every eval lease id (training lease ids stay below: leases.py)
_ID_BITS = 40


@dataclass(slots=True)
class EvalLease:
    lease_id: int
    prompt_index: int  # into the held-out rows
    version: int  # the policy version it must be sampled with
    producer_id: str
    issued_at: float
    key: int  # its round's (the version that began it)


@dataclass(slots=True)
class _Round:
    key: int  # the published version that began it
    started: float
    queue: deque[int]  # prompts not leased yet
    version: int = -1  # the version evaluated: fixed by the first grant (-1 until then)
    open: set[int] = field(default_factory=set)  # lease ids out
    # per answered prompt: (completions, passing, reward sum, completion tokens)
    answered: dict[int, tuple[int, int, float, int]] = field(default_factory=dict)
    closed: bool = False  # nothing more is leased for it
    skipped: int = 0  # prompts given up


class EvalBook:
    """The eval rounds of one consumer incarnation over `num_prompts` held-out prompts;
    `ack(producer_id, ack)` queues an ack for a producer's next reply."""

    def __init__(
        self,
        num_prompts: int,
        *,
        every_steps: int,
        samples: int,
        pass_reward: float,
        ack: Callable[[str, wire.Ack], None],
        incarnation: int = 0,
        last_version: int = 0,
    ) -> None:
        assert min(num_prompts, every_steps, samples) > 0
        self.num_prompts, self.every_steps, self.samples = num_prompts, every_steps, samples
        self.last_version = last_version  # the run's last (run.steps; 0: none): always evaluated
        self.pass_reward = pass_reward
        self._ack = ack
        self._base = EVAL_BIT | (incarnation << _ID_BITS)
        self._next = 0
        self.rounds: dict[int, _Round] = {}  # version -> round, oldest first
        self.open: dict[int, EvalLease] = {}
        self.counts: Counter[str] = Counter()
        self.last_scheduled = -1
        self._results: deque[dict[str, Any]] = deque()

    # -- rounds --------------------------------------------------------------------------------
    def due(self, version: int) -> bool:
        """Whether a published `version` begins a round: the first one, or one that crossed a
        multiple of every_steps since the last round (publish_every or a superseded snapshot
        may skip the multiple itself), or the run's last version."""
        if self.last_scheduled < 0 or (version == self.last_version > self.last_scheduled):
            return True
        return version // self.every_steps > self.last_scheduled // self.every_steps

    def schedule(self, version: int, *, now: float) -> None:
        """Begin the round of `version`; older rounds lease nothing more."""
        if version in self.rounds:  # announced again (a resumed run): its round goes on
            return
        for old in list(self.rounds.values()):  # an ended round leaves the dict
            self._close(old)
        self.rounds[version] = _Round(version, now, deque(range(self.num_prompts)))
        self.last_scheduled = version
        self.counts["rounds"] += 1

    def leasing_version(self) -> int:
        """The version of the round that still has prompts to lease (-1: none, or the round
        has no version yet)."""
        return self.leasing()[0]

    def leasing(self) -> tuple[int, int]:
        """What every reply tells producers (`Status.eval_version`, `Status.eval_from`): the
        version of the round that still has prompts to lease, or, when it has no version yet,
        the version from which the first producer that asks gives it its own; -1 for none."""
        r = next((x for x in reversed(self.rounds.values()) if x.queue), None)
        if r is None:
            return -1, -1
        return (r.version, -1) if r.version >= 0 else (-1, r.key)

    def close_unreachable(self, held: set[int], published: int) -> None:
        """Rounds nobody can sample any more (older than the published snapshot, held by no
        producer: `held` are the versions live producers last reported): one with nothing
        sampled yet takes the version of the next producer that asks (its eval leases were
        given back: a request answered late, after its producer had moved on); any other is
        closed, its unleased prompts skipped."""
        for r in list(self.rounds.values()):
            fixed = r.version >= 0
            if fixed and not r.closed and r.version < published and r.version not in held:
                if not r.answered and not r.open:
                    r.version = -1
                else:
                    self._close(r)

    def _close(self, r: _Round) -> None:
        if not r.closed:
            r.closed = True
            r.skipped += len(r.queue)
            self.counts["prompts_skipped"] += len(r.queue)
            r.queue.clear()
        self._maybe_end(r)

    def _maybe_end(self, r: _Round) -> None:
        if r.open or (r.queue and not r.closed):
            return
        del self.rounds[r.key]
        if r.version != r.key and r.version >= 0:
            self.counts["rounds_retargeted"] += 1
        if len(r.answered) == self.num_prompts:
            self._results.append(self._result(r))
            self.counts["rounds_done"] += 1
        else:
            self.counts["rounds_skipped"] += 1

    # -- leases --------------------------------------------------------------------------------
    def grant(
        self, producer_id: str, loaded_version: int, max_leases: int, *, now: float
    ) -> list[EvalLease]:
        """Up to `max_leases` eval leases for `loaded_version` (the version the producer holds),
        maybe none. A round takes the version of the first producer that asks holding the
        version that began it or a newer one (producers may skip a version while they reload:
        then the next one is evaluated, reported as such, `eval_rounds_retargeted`)."""
        r = next((x for x in reversed(self.rounds.values()) if x.queue), None)
        if r is not None and r.version < 0 and loaded_version >= r.key:
            r.version = loaded_version
        if r is None or r.version < 0 or r.version != loaded_version:
            return []
        out: list[EvalLease] = []
        while r.queue and len(out) < max_leases:
            lease = EvalLease(
                self._base | self._next, r.queue.popleft(), r.version, producer_id, now, r.key
            )
            self._next += 1
            self.open[lease.lease_id] = lease
            r.open.add(lease.lease_id)
            out.append(lease)
        self.counts["issued"] += len(out)
        return out

    def receive(self, g: wire.Group) -> str:
        """An evaluation group arrived: 'accept' (counted), 'late' / 'unknown' (acked expired),
        'wrong_producer' (another producer's lease: nothing changes), 'wrong_version' (not
        sampled with the lease's version: the lease expires, its prompt goes back)."""
        lease = self.open.get(g.lease_id)
        if lease is None:
            self._ack(g.producer_id, wire.Ack(g.lease_id, "expired"))
            return "late" if g.lease_id & EVAL_BIT else "unknown"
        if lease.producer_id != g.producer_id:
            return "wrong_producer"
        if g.behavior_version != lease.version:
            self._end(lease, "expired")
            self._ack(g.producer_id, wire.Ack(g.lease_id, "expired"))
            return "wrong_version"
        rewards = g.rewards.astype(float)
        passed = int((rewards >= self.pass_reward).sum())
        r = self.rounds[lease.key]
        r.answered[lease.prompt_index] = (len(rewards), passed, float(rewards.sum()), g.num_tokens)
        self._end(lease, "answered")
        self._ack(g.producer_id, wire.Ack(g.lease_id, wire.EVALUATED))
        return "accept"

    def decline(self, producer_id: str, lease_ids: tuple[int, ...]) -> None:
        """The producer gave these leases back unsampled (it no longer holds their version)."""
        for lease_id in lease_ids:
            lease = self.open.get(lease_id)
            if lease is not None and lease.producer_id == producer_id:
                self._end(lease, "declined")

    def expire(self, *, now: float, lease_timeout_s: float, gone: set[str]) -> int:
        """Expire overdue eval leases and those of producers gone; how many."""
        doomed = [
            lease
            for lease in self.open.values()
            if now - lease.issued_at > lease_timeout_s or lease.producer_id in gone
        ]
        for lease in doomed:
            self._end(lease, "expired")
        return len(doomed)

    def reconcile(self, producer_id: str, held: set[int]) -> None:
        """A producer (re)registered or left holding `held`: its other eval leases expire."""
        for lease in [x for x in self.open.values() if x.producer_id == producer_id]:
            if lease.lease_id not in held:
                self._end(lease, "expired")

    def expire_all(self) -> None:
        """Shutdown: every open eval lease expires, every round ends (skipped unless whole)."""
        for lease in list(self.open.values()):
            self._end(lease, "expired")
        for r in list(self.rounds.values()):
            self._close(r)

    def _end(self, lease: EvalLease, outcome: str) -> None:
        del self.open[lease.lease_id]
        self.counts[outcome] += 1
        r = self.rounds[lease.key]
        r.open.discard(lease.lease_id)
        if outcome != "answered":  # the prompt goes back, unless nothing more is leased
            if r.closed:
                r.skipped += 1
                self.counts["prompts_skipped"] += 1
            else:
                r.queue.appendleft(lease.prompt_index)
        self._maybe_end(r)

    # -- results -------------------------------------------------------------------------------
    def _result(self, r: _Round) -> dict[str, Any]:
        """A whole round as metrics.jsonl fields (common/files/metrics.py StepRecord)."""
        stats = list(r.answered.values())
        completions = sum(n for n, _, _, _ in stats)
        return {
            "eval_version": r.version,
            "eval_reward_mean": sum(s for _, _, s, _ in stats) / completions,
            "eval_pass_at_1": mean_pass_at_k([(n, c) for n, c, _, _ in stats], 1),
            "eval_pass_at_k": mean_pass_at_k([(n, c) for n, c, _, _ in stats], self.samples),
            "eval_k": self.samples,
            "eval_completion_len_mean": sum(t for _, _, _, t in stats) / completions,
            "eval_prompts": len(stats),
        }

    def ended(self, key: int) -> bool:
        """Whether the round of version `key` was begun and has ended (reported or skipped)."""
        return self.last_scheduled >= key and key not in self.rounds

    def take_result(self, *, newest: bool = False) -> dict[str, Any] | None:
        """The oldest finished round's result not taken yet (one per learner step); `newest`:
        the newest, for the run's last line (older ones not taken yet are logged)."""
        if newest:
            while len(self._results) > 1:
                log.info("evaluation not in metrics.jsonl (the run ended): %s", self._results[0])
                self._results.popleft()
        return self._results.popleft() if self._results else None

    def totals(self) -> dict[str, int]:
        """The counters for metrics.jsonl (`eval_leases_*`, `eval_prompts_skipped`, ...)."""
        c = self.counts
        keys = ("issued", "answered", "declined", "expired")
        return {
            **{f"eval_leases_{k}": c[k] for k in keys},
            "eval_prompts_skipped": c["prompts_skipped"],
            "eval_rounds_skipped": c["rounds_skipped"],
            "eval_rounds_retargeted": c["rounds_retargeted"],
        }

    def balance(self) -> bool:
        """issued == answered + declined + expired + open."""
        c = self.counts
        return c["issued"] == c["answered"] + c["declined"] + c["expired"] + len(self.open)
