"""Leases and the ledger: a pure state machine (no sockets, no clocks of its own; `now` is passed).

A lease hands one prompt to one producer for one intended optimizer step `step`, with the oldest
weight version it may be sampled with, `min_version = step - max_staleness`. Life of a lease:

    issued ──receive──▶ received ──finalize──▶ trained | dropped_stale | dropped_zero_variance
       │  ▲   │              ▲                   | rejected_invalid
       │  │   └─hold──▶ held ┘ (no room: the producer keeps the group, re-sends when told)
       └──expire (producer silent, lease overdue, producer re-registered without it)──▶ expired

Invariants:
- Staleness by construction: a lease for step s is granted only while
  `s - max_staleness <= published_version` (the producer can load weights good enough at once)
  and `s - max_staleness <= policy_version`. The step of a new lease is
  `policy_version + open // prompts_per_step`, where `open` counts leases not yet final, so at
  most `(max_staleness + 1) * prompts_per_step` leases are open at any time.
- Every lease ends in exactly one final state (`OUTCOMES`); `balance()` checks
  issued == sum(final) + open, in total and per producer. A lease belongs to the producer it was
  issued to: a group for an open lease from any other producer is refused (`wrong_producer`)
  and the lease stays with its holder, which may still deliver it (lease ids are sequential:
  guessing one must not earn a producer another's credit, or get a forged group trained).
  Checkpoints written when a lease could move to the producer that delivered it may carry
  `handed_over` / `taken_over` counts; the per-producer balance still counts them:
  issued + taken_over - handed_over == sum(final) + open.
  A group id is its lease id: a second delivery of the same lease is
  a duplicate and never reaches the trainer; a group for an expired lease is late and is dropped.
- Lease ids carry the consumer's incarnation in their high bits (`incarnation << 40 | n`), so a
  restarted consumer never mistakes an old group for a lease it issued anew.
- A `held` lease (its group arrived when the consumer had no room: consumer/server/admission.py)
  never times out: its producer holds the finished group and re-sends it when told; it expires only
  with its producer (silent, or re-registered or left without it).
- Expiry costs what expires, not what is open (the network thread runs it every 0.25 s): issued
  leases sit in a heap by issue time (`timeout` pops the overdue ones; an entry whose lease was
  delivered or ended meanwhile is discarded when it surfaces), and each producer's open leases
  are indexed (`holds`, `reconcile` and the leases of a gone producer cost what that producer
  holds). The result, in lease-id order, is what a scan of every open lease would find.
- `take_changed` hands the ledger writer (consumer/server/books.py) the per-producer counts of
  the producers whose counts or open leases changed since the last call, nothing else.
- Prompts of expired and stale-dropped leases go back to the retry queue (nothing silently lost);
  rejected_invalid prompts are not retried (the same prompt may produce the same bad output).
- Acks (lease id + outcome) queue per producer and leave with that producer's next reply. A
  queue holds at most `MAX_ACKS` (the oldest go first, counted in `acks_dropped`): a lost ack
  only means the producer re-sends that group and is told its outcome again. `forget_acks`
  drops the queue of a producer that will not come back.
"""

from __future__ import annotations

import base64
import dataclasses
import heapq
from collections import Counter, defaultdict, deque
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from common.files.run_files import Balance, LeaseLine
from common.wire import ACKS_PER_REPLY, HOLD, OUTCOMES, SEND, Ack
from consumer.data.prompts import PromptOrder

OPEN_STATES = ("issued", "held", "received")
RETRY_OUTCOMES = ("expired", "dropped_stale")
MAX_ACKS = 1 << 14  # per producer: ~1.6 MB of acks at most
_ID_BITS = 40


@dataclass(slots=True)
class LeaseRecord:
    lease_id: int
    prompt_index: int
    step: int
    min_version: int
    producer_id: str
    issued_at: float
    state: str = "issued"
    behavior_version: int = -1
    trained_step: int = -1
    num_tokens: int = 0
    reason: str = ""

    def line(self) -> LeaseLine:
        """The record as a line of leases.jsonl (common/files/run_files.py)."""
        return LeaseLine(**asdict(self))


class FinalStates:
    """Final outcome by lease id, one byte per lease (a long run ends millions of leases).

    Lease ids are `incarnation << 40 | n` with n counting up from 0, so each incarnation's
    outcomes live in one `bytearray` indexed by n: 0 = not final, i + 1 = `OUTCOMES[i]`.
    Reads like a dict (`get`, `[]`, `in`, iteration over lease ids, `len`, `==`).
    """

    def __init__(self) -> None:
        self._by_incarnation: dict[int, bytearray] = {}

    def __setitem__(self, lease_id: int, outcome: str) -> None:
        incarnation, n = lease_id >> _ID_BITS, lease_id & ((1 << _ID_BITS) - 1)
        codes = self._by_incarnation.setdefault(incarnation, bytearray())
        if n >= len(codes):
            codes.extend(bytes(max(n + 1 - len(codes), len(codes) // 2)))  # amortised growth
        codes[n] = OUTCOMES.index(outcome) + 1

    def get(self, lease_id: int) -> str | None:
        codes = self._by_incarnation.get(lease_id >> _ID_BITS)
        n = lease_id & ((1 << _ID_BITS) - 1)
        if codes is None or n >= len(codes) or codes[n] == 0:
            return None
        return OUTCOMES[codes[n] - 1]

    def __getitem__(self, lease_id: int) -> str:
        outcome = self.get(lease_id)
        if outcome is None:
            raise KeyError(lease_id)
        return outcome

    def __contains__(self, lease_id: object) -> bool:
        return isinstance(lease_id, int) and self.get(lease_id) is not None

    def __iter__(self) -> Iterator[int]:
        for incarnation, codes in sorted(self._by_incarnation.items()):
            base = incarnation << _ID_BITS
            yield from (base | n for n, code in enumerate(codes) if code)

    def __len__(self) -> int:
        return sum(len(codes) - codes.count(0) for codes in self._by_incarnation.values())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FinalStates):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    def items(self) -> Iterator[tuple[int, str]]:
        return ((lease_id, self[lease_id]) for lease_id in self)

    def state_dict(self) -> dict[str, str]:
        """incarnation -> base64 of its outcome codes (trailing unused bytes dropped)."""
        return {
            str(i): base64.b64encode(bytes(codes).rstrip(b"\0")).decode()
            for i, codes in self._by_incarnation.items()
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> FinalStates:
        out = cls()
        for key, value in state.items():
            if isinstance(value, str) and value not in OUTCOMES:  # incarnation -> base64 codes
                codes = bytearray(base64.b64decode(value))
                if any(c > len(OUTCOMES) for c in codes):
                    raise ValueError(f"checkpoint: unknown lease outcome code in {key!r}")
                out._by_incarnation[int(key)] = codes
            else:  # lease id -> outcome (checkpoints written before the compact form)
                out[int(key)] = value
        return out


def producer_balanced(counts: Mapping[str, int], open_leases: int) -> bool:
    """One producer's counts add up: issued + taken_over - handed_over == finals + open."""
    held = counts.get("issued", 0) + counts.get("taken_over", 0) - counts.get("handed_over", 0)
    return held == sum(counts.get(k, 0) for k in OUTCOMES) + open_leases


class LeaseBook:
    def __init__(
        self, order: PromptOrder, *, prompts_per_step: int, max_staleness: int, incarnation: int = 0
    ) -> None:
        self.order = order
        self.prompts_per_step = prompts_per_step
        self.max_staleness = max_staleness
        self.incarnation = incarnation
        self._next = 0
        self.open: dict[int, LeaseRecord] = {}
        self.counts: Counter[str] = Counter()  # final states, plus "issued"
        self.by_producer: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.final_states = FinalStates()  # lease id -> outcome (for duplicates and acks)
        self.acks: defaultdict[str, deque[Ack]] = defaultdict(lambda: deque(maxlen=MAX_ACKS))
        self.acks_dropped = 0
        self.finished: list[LeaseRecord] = []  # final records not yet written to leases.jsonl
        self._open_by: defaultdict[str, set[int]] = defaultdict(set)  # producer -> open ids
        self._issued: list[tuple[float, int]] = []  # heap of (issued_at, lease id)
        self._changed: set[str] = set()  # producers whose counts or open leases changed

    # -- granting ------------------------------------------------------------------------------
    def next_step(self, policy_version: int) -> int:
        return policy_version + len(self.open) // self.prompts_per_step

    def grant(
        self,
        producer_id: str,
        max_leases: int,
        *,
        policy_version: int,
        published_version: int,
        now: float,
    ) -> list[LeaseRecord]:
        """Up to `max_leases` new leases that respect the staleness bound (maybe none)."""
        out = []
        for _ in range(max_leases):
            step = self.next_step(policy_version)
            min_version = max(step - self.max_staleness, 0)
            if min_version > min(policy_version, published_version):
                break
            index = self.order.next()
            if index is None:
                break
            lease_id = (self.incarnation << _ID_BITS) | self._next
            self._next += 1
            rec = LeaseRecord(lease_id, index, step, min_version, producer_id, now)
            self._add_open(rec)
            self.counts["issued"] += 1
            self.by_producer[producer_id]["issued"] += 1
            out.append(rec)
        return out

    # -- delivery ------------------------------------------------------------------------------
    def receive(self, lease_id: int, producer_id: str) -> str:
        """Classify an arriving group: 'accept', 'duplicate', 'late', 'unknown' or
        'wrong_producer' (an open lease held by another producer: nothing changes).

        'late', 'duplicate' and 'unknown' queue an ack with the lease's final state (expired
        when unknown) so the producer forgets the group.
        """
        rec = self.open.get(lease_id)
        if rec is not None:
            if rec.producer_id != producer_id:
                return "wrong_producer"
            if rec.state == "received":
                return "duplicate"
            rec.state = "received"
            return "accept"
        final = self.final_states.get(lease_id)
        if final is None:
            self._ack(producer_id, Ack(lease_id, "expired"))
            return "unknown"
        self._ack(producer_id, Ack(lease_id, final))
        return "late" if final == "expired" else "duplicate"

    def hold(self, lease_id: int) -> None:
        """The group of an accepted lease (`receive`) was not admitted: its producer holds it
        (the lease stays open and does not time out) until told to send it again."""
        rec = self.open[lease_id]
        assert rec.state in ("received", "held"), rec.state
        rec.state = "held"
        self._ack(rec.producer_id, Ack(lease_id, HOLD))

    def release(self, lease_id: int) -> None:
        """Tell the producer of a held lease to send its group now (room is kept for it)."""
        rec = self.open[lease_id]
        self._ack(rec.producer_id, Ack(lease_id, SEND))

    def queue_ack(self, producer_id: str, ack: Ack) -> None:
        """Queue an ack that is not this ledger's (an eval lease's: consumer/evaluation/rounds.py)
        for `producer_id`'s next reply."""
        self._ack(producer_id, ack)

    def _ack(self, producer_id: str, ack: Ack) -> None:
        queue = self.acks[producer_id]
        if len(queue) == MAX_ACKS:
            self.acks_dropped += 1
        queue.append(ack)

    def finalize(self, lease_id: int, outcome: str, **info: Any) -> LeaseRecord:
        """Move an open lease to its final `outcome`; queue the producer's ack."""
        assert outcome in OUTCOMES, outcome
        rec = self.open.pop(lease_id)
        mine = self._open_by[rec.producer_id]
        mine.discard(lease_id)
        if not mine:
            del self._open_by[rec.producer_id]
        self._changed.add(rec.producer_id)
        assert outcome == "expired" or rec.state == "received" or outcome == "rejected_invalid"
        delivered = rec.state == "received" or outcome == "rejected_invalid"
        rec.state = outcome
        for key, value in info.items():
            setattr(rec, key, value)
        self.counts[outcome] += 1
        self.by_producer[rec.producer_id][outcome] += 1
        self.final_states[lease_id] = outcome
        if delivered:
            self._ack(rec.producer_id, Ack(lease_id, outcome))
        if outcome in RETRY_OUTCOMES:
            self.order.requeue(rec.prompt_index)
        self.finished.append(rec)
        return rec

    def take_acks(self, producer_id: str, limit: int = ACKS_PER_REPLY) -> tuple[Ack, ...]:
        """The oldest `limit` acks queued for `producer_id` (the rest wait for the next reply:
        one reply stays well within the decoder's limits)."""
        queue = self.acks.get(producer_id)
        if not queue:
            self.acks.pop(producer_id, None)
            return ()
        out = tuple(queue.popleft() for _ in range(min(limit, len(queue))))
        if not queue:
            del self.acks[producer_id]
        return out

    def requeue_acks(self, producer_id: str, acks: tuple[Ack, ...]) -> None:
        """Put acks taken for a reply that could not be sent back at the head of the queue."""
        queue = self.acks[producer_id]
        for ack in reversed(acks):
            if len(queue) == MAX_ACKS:
                self.acks_dropped += 1
                queue.pop()
            queue.appendleft(ack)

    def forget_acks(self, producer_id: str) -> None:
        """Drop the acks queued for a producer that will not come back."""
        self.acks.pop(producer_id, None)

    def holds(self, producer_id: str) -> bool:
        """True while `producer_id` holds an open lease."""
        return bool(self._open_by.get(producer_id))

    def _add_open(self, rec: LeaseRecord) -> None:
        self.open[rec.lease_id] = rec
        self._open_by[rec.producer_id].add(rec.lease_id)
        self._changed.add(rec.producer_id)
        if rec.state == "issued":
            heapq.heappush(self._issued, (rec.issued_at, rec.lease_id))

    # -- expiry --------------------------------------------------------------------------------
    def expire(self, *, now: float, lease_timeout_s: float, gone: set[str]) -> list[LeaseRecord]:
        """Expire issued (not yet delivered) leases that are overdue, and issued or held ones
        whose producer is gone (a held group is waiting for room, not late); in lease-id order.
        Costs what expires (plus entries of leases delivered since), not what is open."""
        doomed = set()
        heap = self._issued
        while heap and now - heap[0][0] > lease_timeout_s:
            issued_at, lease_id = heapq.heappop(heap)
            rec = self.open.get(lease_id)
            if rec is not None and rec.state == "issued" and rec.issued_at == issued_at:
                doomed.add(lease_id)
        for producer_id in gone:
            for lease_id in self._open_by.get(producer_id, ()):
                if self.open[lease_id].state in ("issued", "held"):
                    doomed.add(lease_id)
        return [self.finalize(i, "expired", reason="timeout") for i in sorted(doomed)]

    def reconcile(
        self, producer_id: str, held: set[int], *, reason: str = "not held"
    ) -> list[LeaseRecord]:
        """A producer (re)registered or left holding `held`: its other undelivered leases are
        lost (expired with `reason`)."""
        doomed = sorted(
            i
            for i in self._open_by.get(producer_id, ())
            if self.open[i].state in ("issued", "held") and i not in held
        )
        return [self.finalize(i, "expired", reason=reason) for i in doomed]

    def expire_all(self, reason: str) -> list[LeaseRecord]:
        """Shutdown: every open lease ends as expired (its prompt goes back to the queue)."""
        return [self.finalize(i, "expired", reason=reason) for i in list(self.open)]

    # -- accounting ----------------------------------------------------------------------------
    def balance(self) -> Balance:
        """Counts by state; `ok` when issued == sum(final states) + open, in total and for
        every producer (counting the leases it took over from others and handed over to them)."""
        totals = self.totals()
        ok = totals.issued == sum(totals.final(k) for k in OUTCOMES) + totals.open
        for p, c in self.by_producer.items():
            ok = ok and producer_balanced(c, len(self._open_by.get(p, ())))
        return dataclasses.replace(totals, ok=ok)

    @property
    def changed(self) -> bool:
        """Whether some producer's counts or open leases changed since `take_changed`."""
        return bool(self._changed)

    def take_changed(self) -> dict[str, tuple[dict[str, int], int]]:
        """{producer: (its counts, its open leases)} for the producers whose counts or open
        leases changed since the last call (the cost is theirs, not every producer's)."""
        out = {
            p: (dict(self.by_producer[p]), len(self._open_by.get(p, ())))
            for p in self._changed
            if p in self.by_producer
        }
        self._changed = set()
        return out

    def touch(self, producer_id: str) -> None:
        """`producer_id`'s ledger entry is due again (its host changed), if it has one."""
        self._changed.add(producer_id)

    def totals(self) -> Balance:
        """Counts by state in total (`balance` without its per-producer check, `ok` None: its
        cost does not grow with the number of producers)."""
        c = self.counts
        return Balance(
            issued=c["issued"],
            trained=c["trained"],
            dropped_stale=c["dropped_stale"],
            dropped_zero_variance=c["dropped_zero_variance"],
            rejected_invalid=c["rejected_invalid"],
            expired=c["expired"],
            open=len(self.open),
        )

    def take_finished(self) -> list[LeaseLine]:
        """The leases finished since the last call, as lines of leases.jsonl."""
        out = [r.line() for r in self.finished]
        self.finished.clear()
        return out

    # -- checkpoint ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "incarnation": self.incarnation,  # a resumed book counts lease ids from 0 again
            "open": [asdict(r) for r in self.open.values()],
            "counts": dict(self.counts),
            "by_producer": {p: dict(c) for p, c in self.by_producer.items()},
            "final_states": self.final_states.state_dict(),
            "order": self.order.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], *, now: float) -> None:
        """Restore, as the next incarnation. Delivered-but-untrained groups died with the old
        process, so their leases go back to 'issued': the producers still hold them unacked and
        re-send them (or, if those producers are gone too, the leases expire)."""
        self.incarnation = int(state["incarnation"]) + 1
        self._next = 0
        self.open, self._open_by, self._issued = {}, defaultdict(set), []
        for raw in state["open"]:
            rec = LeaseRecord(**raw)
            rec.state, rec.issued_at = "issued", now
            self._add_open(rec)
        self.counts = Counter(state["counts"])
        self.by_producer = defaultdict(
            Counter, {p: Counter(c) for p, c in state["by_producer"].items()}
        )
        self._changed = set(self.by_producer) | set(self._open_by)
        self.final_states = FinalStates.from_state_dict(state["final_states"])
        self.order.load_state_dict(state["order"])
