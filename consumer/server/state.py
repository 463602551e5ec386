"""What the network thread knows, shared by its parts (consumer/server/: control, intake,
parked, books, loop): the lease book, producer identities and views, the admission queue and the
versions every reply carries; the eval rounds (consumer/evaluation/rounds.py) when `[eval]` is on.

Invariants:
- Only the network thread reads or writes a `NetState`, except `counters` and `producers`, which
  it changes, and other threads copy, under `lock` (`Server.view`, `Server.ready_producers`).
- A message whose handling raises, even through a bug of ours, is counted by `internal_error` as
  `rejected.internal_error` (and `internal_error.<exception type>`), logged with its traceback
  the first time, and the loop goes on. Log lines about bad messages are rate-limited per reason
  (common/net/log_limit.py): a flood of garbage is counted, not written out line by line.
- Every change to a producer's view is noted (`note`) as that producer's new `ProducerStatus`
  in `roster_changes`, which the books take whole (a swap) and write off this thread
  (consumer/server/books.py): the view's counters are the last heartbeat's decoded mapping, held,
  never copied or changed.
- Every reply carries the newest policy and snapshot version (`status`: a missed announcement
  costs latency, never correctness), the acks queued for that producer, and the heartbeat
  period for the producers now live (common/net/heartbeat.py; `periods` keeps the longest sent
  lately, which sets the silence after which a producer is gone: `producer_timeout_s`).

Who writes what (`WRITTEN_BY`, pinned by tests/unit/test_net_state.py): each attribute is set,
and a container's entries are changed, in one module. This one owns the producers' records
(`register`, `route`, `forget`, `note`, `take_roster_changes`, `status`) and the counters
(`count`); consumer/server/server.py owns the versions every reply carries, the two switches
(`accepting`, `granting`) and the eval rounds it builds. The other parts (control, intake,
parked, loop, books) call those methods and the books' own (`book`, `admission`, `identities`,
`liveness`, `periods`, `timing`: objects bound once here, each changing only through its
methods); ledger.json is behind when the lease book says so (`LeaseBook.changed`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import zmq

from common import wire
from common.config import Config
from common.files import run_files as RF
from common.files.net_stats import LoopTiming
from common.net.log_limit import LogLimiter
from consumer.data.prompts import PromptSource
from consumer.data.rows import PromptRow
from consumer.evaluation.rounds import EvalBook
from consumer.server.admission import Admission
from consumer.server.identity import Identities
from consumer.server.leases import LeaseBook
from consumer.server.liveness import Liveness, SentPeriods
from consumer.server.roster import status_of

log = logging.getLogger("asyncgrpo.consumer")

_HERE, _SERVER = "consumer/server/state.py", "consumer/server/server.py"
WRITTEN_BY = {  # NetState attribute -> the one module that sets it or changes its entries
    "cfg": _HERE,
    "prompts": _HERE,
    "book": _HERE,
    "identities": _HERE,
    "admission": _HERE,
    "run_id": _HERE,
    "counters": _HERE,
    "lock": _HERE,
    "producers": _HERE,
    "liveness": _HERE,
    "periods": _HERE,
    "timing": _HERE,
    "roster_changes": _HERE,
    "expected": _HERE,
    "hosts": _HERE,
    "routes": _HERE,
    "told_finished": _HERE,
    "log": _HERE,
    "policy_version": _SERVER,
    "snapshot": _SERVER,
    "accepting": _SERVER,
    "granting": _SERVER,
    "evals": _SERVER,
    "eval_rows": _SERVER,
    "settled_on_arrival": _HERE,
}


def peer_key(frame: zmq.Frame) -> str:
    """The CurveZMQ public key (z85) of the connection `frame` came over; "" without CurveZMQ."""
    try:
        return str(frame.get("User-Id") or "")
    except zmq.ZMQError:  # no security mechanism: the property does not exist
        return ""


@dataclass(slots=True)
class ProducerView:
    host: str
    pid: int
    engine: str
    loaded_version: int
    state: str = "registered"
    last_seen: float = 0.0
    num_in_flight: int = 0
    counters: dict[str, float] = field(default_factory=dict)  # the last heartbeat's: never changed
    ended_at: float = 0.0  # monotonic time it left or went silent (state "left" or "gone")


class NetState:
    """The network thread's books: built by `Server`, read and changed by its parts."""

    def __init__(
        self,
        cfg: Config,
        *,
        prompts: PromptSource,
        book: LeaseBook,
        identities: Identities,
        admission: Admission,
        run_id: str,
        policy_version: int,
        granting: bool,
    ) -> None:
        self.cfg, self.prompts = cfg, prompts
        self.book, self.identities, self.admission = book, identities, admission
        self.run_id = run_id
        self.counters: Counter[str] = Counter()
        self.lock = threading.Lock()  # guards counters/producers copies for other threads
        self.producers: dict[str, ProducerView] = {}
        self.liveness = Liveness()  # who went silent, who may be forgotten
        self.periods = SentPeriods(cfg.net.heartbeat_s, cfg.net.max_heartbeats_per_s)
        self.timing = LoopTiming()  # the loop and lease requests timed (netstats.json)
        # producer -> its status since the books last took these (None: forgotten)
        self.roster_changes: dict[str, RF.ProducerStatus | None] = {}
        # producers of the previous incarnation: they re-register by themselves, and should hear
        # the end of the run too if it comes before they have
        self.expected = set(identities.keys)
        self.hosts: dict[str, str] = {}  # producer id -> host it registered from
        self.routes: dict[str, bytes] = {}  # producer id -> ROUTER identity of its last request
        # producers whose last reply said finished -> when first told (monotonic s)
        self.told_finished: dict[str, float] = {}
        self.policy_version = policy_version
        self.snapshot: wire.SnapshotInfo | None = None
        self.accepting = True  # False once the learner needs no more groups
        self.granting = granting  # False until Server.open_grants() when held
        self.log = LogLimiter(log)
        # evaluation during training (`[eval]`): its rounds and held-out rows; None when off
        self.evals: EvalBook | None = None
        self.eval_rows: list[PromptRow] = []
        # leases of zero-variance groups ended on arrival (consumer/server/intake.py), until the
        # learner takes their group; read by the learner's thread under `lock`
        self.settled_on_arrival: set[int] = set()

    def register(self, producer_id: str, view: ProducerView) -> None:
        """A producer (re-)registered: its view, its host, noted for the roster."""
        with self.lock:
            self.producers[producer_id] = view
        self.hosts[producer_id] = view.host
        self.note(producer_id)

    def route(self, producer_id: str, identity: bytes) -> None:
        """The ROUTER identity `producer_id`'s last request came over (pushes go there)."""
        self.routes[producer_id] = identity

    def forget(self, producer_ids: list[str]) -> None:
        """Producers that ended long ago and hold no lease: their records go (their host stays
        while the ledger still counts their leases)."""
        with self.lock:
            for p in producer_ids:
                del self.producers[p]
        for p in producer_ids:
            self.note(p)
            if p not in self.book.by_producer:
                self.hosts.pop(p, None)
            self.routes.pop(p, None)
            self.told_finished.pop(p, None)

    def take_roster_changes(self) -> dict[str, RF.ProducerStatus | None]:
        """The producers' statuses changed since the last call (the books write them)."""
        changes, self.roster_changes = self.roster_changes, {}
        return changes

    def note(self, producer_id: str) -> None:
        """`producer_id`'s view changed (or it was forgotten): the roster writes it next."""
        view = self.producers.get(producer_id)
        self.roster_changes[producer_id] = None if view is None else status_of(view)

    def settle_on_arrival(self, lease_id: int) -> None:
        """`lease_id`'s group ends as it arrives (consumer/server/intake.py), the learner told."""
        with self.lock:
            self.settled_on_arrival.add(lease_id)

    def unsettle(self, lease_id: int) -> None:
        """`lease_id`'s group was not admitted after all: its lease stays open."""
        with self.lock:
            self.settled_on_arrival.discard(lease_id)

    def took_settled(self, lease_id: int) -> bool:
        """The learner took `lease_id`'s group from its queue: whether its lease already ended
        on arrival (then forgotten here)."""
        with self.lock:
            early = lease_id in self.settled_on_arrival
            self.settled_on_arrival.discard(lease_id)
        return early

    def finalize(self, lease_id: int, outcome: str, **info: Any) -> None:
        """End the lease with `outcome` (the network thread), unless it ended when its group
        arrived (zero variance, intake.py)."""
        if self.took_settled(lease_id):
            assert outcome == "dropped_zero_variance", outcome
            return
        self.book.finalize(lease_id, outcome, **info)

    def is_settled(self, lease_id: int) -> bool:
        """Whether `lease_id`'s lease ended when its group arrived (any thread)."""
        with self.lock:
            return lease_id in self.settled_on_arrival

    def count(self, key: str, n: int = 1) -> None:
        """Add `n` to counter `key` (other threads copy the counters under `lock`)."""
        with self.lock:
            self.counters[key] += n

    def status(self, producer_id: str | None) -> wire.Status:
        """What every reply to `producer_id` carries (its queued acks are taken)."""
        acks = self.book.take_acks(producer_id) if producer_id else ()
        if producer_id and not self.accepting:
            self.told_finished.setdefault(producer_id, time.monotonic())
        eval_version, eval_from = self.evals.leasing() if self.evals is not None else (-1, -1)
        return wire.Status(
            run_id=self.run_id,
            policy_version=self.policy_version,
            snapshot=self.snapshot,
            acks=acks,
            finished=not self.accepting,
            eval_version=eval_version,
            eval_from=eval_from,
            heartbeat_s=self.periods.current(len(self.liveness), time.monotonic()),
        )

    def producer_timeout_s(self) -> float:
        """The silence after which a producer is gone: net.producer_timeout_s, or three of the
        longest heartbeat periods sent lately when that is longer."""
        return self.periods.timeout_s(self.cfg.net.producer_timeout_s)

    def internal_error(self, exc: Exception) -> None:
        """Handling one message raised: count it, log it (with its traceback the first time
        for its type) and go on; the message is dropped."""
        name = type(exc).__name__
        with self.lock:
            self.counters["rejected.internal_error"] += 1
            self.counters[f"internal_error.{name}"] += 1
            self.counters["rejected"] += 1
        self.log.log(
            f"internal_error.{name}",
            logging.ERROR,
            "a message raised %s while it was handled: dropped, the consumer goes on",
            name,
            exc_info=True,
        )
