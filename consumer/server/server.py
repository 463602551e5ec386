"""The consumer's network side: `Server`, the typed handle other threads hold on the network
thread, which owns every socket and the lease book.

Sockets (all bound here): `control` ROUTER (register, heartbeat, lease requests, fetch plans
and reports, goodbye: consumer/server/control.py), `rollouts` PULL (groups:
consumer/server/intake.py), `announce` PUB (new snapshot versions, hints only). Snapshot chunks
are served on the `data` ROUTER by its own thread (consumer/snapshots/dataplane.py, started and
stopped with this one), so control never waits behind bulk bytes. The thread's loop is
consumer/server/loop.py; what it knows, consumer/server/state.py.

Invariants:
- Only the network thread touches the sockets and the lease book (`LeaseBook`, private to this
  package: the server builds it, restores it on resume and hands out only copies of its state).
  Other threads use the methods under "API for other threads" (each runs its work on the network
  thread, between socket events, through a queue of callables answered by futures:
  consumer/server/calls.py) and receive admitted groups through `next_group`: a queue bounded in
  groups and bytes (consumer/server/admission.py).
- A call nobody waits for (`drop`) that fails stops the network thread; `check` re-raises its
  failure on the caller's thread.
- Built with `hold_grants`, the server grants no lease until `open_grants()` (the learner waits
  for `run.wait_for_producers` ready producers first: `ready_producers`).
- Nothing per step grows with the number of producers (consumer/server/books.py);
  `step_summary` is a fixed-size answer.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import zmq

from common import wire
from common.config import Config
from common.files import run_files as RF
from common.files.disk import size_of
from common.net.heartbeat import GOODBYE_WAIT_S
from common.net.keys import Keys
from common.net.sockets import server_socket
from consumer.data.prompts import PromptOrder, PromptSource
from consumer.evaluation import evaluate_through_producers
from consumer.server.admission import Admission
from consumer.server.books import Books
from consumer.server.calls import Calls
from consumer.server.control import Control
from consumer.server.handshakes import Handshakes
from consumer.server.identity import Identities
from consumer.server.intake import Intake
from consumer.server.leases import LeaseBook
from consumer.server.loop import Loop
from consumer.server.state import NetState
from consumer.server.wire_terms import group_limits
from consumer.snapshots import base_model
from consumer.snapshots.dataplane import DataPlane
from consumer.snapshots.fanout import FanOut
from consumer.snapshots.fetch_files import snapshot_chunk_bytes

log = logging.getLogger("asyncgrpo.consumer")
T = TypeVar("T")


class Server:
    """The network thread and its lease book. Build it, `start()` it, `stop()` it.

    `book_state` (from a checkpoint) restores the lease book as the next incarnation;
    `policy_version` is the learner's version at start.
    """

    def __init__(
        self,
        cfg: Config,
        ctx: zmq.Context[Any],
        *,
        prompts: PromptSource,
        spec: wire.RunSpec,
        run_dir: Path,
        keys: Keys | None,
        policy_version: int = 0,
        book_state: RF.BookState | None = None,
        hold_grants: bool = False,
        refused_keys: Callable[[], int] | None = None,
    ) -> None:
        self.run_dir = run_dir
        st = self._state = _restored_state(cfg, prompts, book_state, policy_version, hold_grants)
        rounds = evaluate_through_producers(
            cfg, ack=st.book.queue_ack, incarnation=st.book.incarnation
        )
        if rounds is not None:  # rows read before any socket is bound: bad data stops us here
            st.evals, st.eval_rows = rounds
        self.incarnation = st.book.incarnation
        self.run_id = st.run_id
        net = cfg.net
        max_bytes = int(net.max_message_mib * (1 << 20))

        def bind(kind: int, port: int) -> tuple[zmq.Socket[Any], int]:
            return server_socket(
                ctx,
                kind,
                host=net.bind_host,
                port=port,
                keys=keys,
                insecure=net.insecure,
                max_message_bytes=max_bytes,
            )

        control, control_port = bind(zmq.ROUTER, net.control_port)
        rollouts, rollouts_port = bind(zmq.PULL, net.rollouts_port)
        self._announce, announce_port = bind(zmq.PUB, net.announce_port)
        snapshot_root = run_dir / RF.SNAPSHOTS
        model_dir = Path(spec.model) if spec.model and Path(spec.model).is_dir() else None
        if model_dir is not None:  # for producers without a copy (consumer/snapshots/base_model.py)
            spec = dataclasses.replace(spec, model_files=base_model.listing(model_dir))
        self.data = DataPlane(
            snapshot_root,
            host=net.bind_host,
            port=net.data_port,
            keys=keys,
            insecure=net.insecure,
            chunk_limit=snapshot_chunk_bytes(cfg),
            count=st.count,
            model_dir=model_dir,
            model_files=frozenset(f.name for f in spec.model_files),
        )
        self.ports = {
            "control": control_port,
            "rollouts": rollouts_port,
            "announce": announce_port,
            "data": self.data.port,
        }
        self.spec = dataclasses.replace(
            spec, rollouts_port=rollouts_port, announce_port=announce_port, data_port=self.data.port
        )
        fanout = FanOut(snapshot_root, max_children=cfg.snapshot.fanout, count=st.count)
        self._control = Control(
            st, control, spec=self.spec, limits=wire.control_limits(), fanout=fanout
        )
        intake = Intake(st, group_limits(cfg, max_bytes, vocab_size=spec.vocab_size))
        data = self.data

        def refused() -> int:  # the key gates of control (the caller's) and of the data socket
            return (refused_keys() if refused_keys is not None else 0) + data.refused_keys

        self._books = Books(st, run_dir, refused_keys=refused)
        self._calls = Calls()
        self._loop = Loop(
            st,
            control=self._control,
            intake=intake,
            books=self._books,
            calls=self._calls,
            rollouts=rollouts,
            announce=self._announce,
            handshakes=Handshakes(control, st.count),
        )

    @property
    def error(self) -> BaseException | None:
        """Why the network thread died, if it did."""
        return self._loop.error

    # -- API for other threads -----------------------------------------------------------------
    def start(self) -> None:
        self.data.start()
        self._loop.start()

    def _call(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the network thread (between socket events); its result via the future."""
        return self._calls.submit(fn, stopped=self._loop.stopped())

    def stop(self) -> None:
        self._loop.stop()
        self.data.stop()
        evals = self._state.evals
        if evals is not None:  # the network thread has stopped: its books are ours to read
            log.info(
                "evaluation: %d rounds reported, %s (balanced: %s)",
                evals.counts["rounds_done"],
                evals.totals(),
                evals.balance(),
            )

    def next_group(self, timeout_s: float) -> wire.Group | None:
        """The next admitted group, or None after `timeout_s` without one."""
        return self._state.admission.get(timeout_s)

    def drop(self, group: wire.Group, outcome: str) -> None:
        """End `group`'s lease as `outcome` (a dropped_* state) without waiting: its slot is
        granted again as soon as the network thread gets to it. A failure (a lease-book bug)
        stops the network thread and reaches the caller through `check`."""
        info = {"behavior_version": group.behavior_version, "num_tokens": group.num_tokens}
        fut = self._call(lambda: self._state.finalize(group.lease_id, outcome, **info))
        fut.add_done_callback(self._fail_on_error)

    def settled_on_arrival(self, group: wire.Group) -> bool:
        """Whether `group`'s lease already ended when it arrived (zero variance, fresh): the
        learner drops it as `dropped_zero_variance` whatever its lag is by now."""
        return self._state.is_settled(group.lease_id)

    def settle_trained(self, groups: Sequence[wire.Group], *, trained_step: int) -> None:
        """The optimizer step `trained_step` consumed `groups`: end their leases as trained,
        move the policy version to `trained_step + 1` (new leases follow it) and append them
        to leases.jsonl, all at once (ledger.json follows within the books' interval)."""
        st = self._state

        def settle() -> None:
            for g in groups:
                st.book.finalize(
                    g.lease_id,
                    "trained",
                    behavior_version=g.behavior_version,
                    trained_step=trained_step,
                    num_tokens=g.num_tokens,
                )
            st.policy_version = trained_step + 1
            self._books.append_finished()

        self._call(settle).result()

    def stop_granting(self) -> None:
        """No more leases; every reply from now on tells producers the run is finished."""

        def stop() -> None:
            self._state.accepting = False

        self._call(stop).result()

    def open_grants(self) -> None:
        """Start granting leases (a server built with `hold_grants`)."""

        def start() -> None:
            self._state.granting = True

        self._call(start).result()

    def ready_producers(self) -> dict[str, str]:
        """Producers registered and holding this run's newest snapshot ("idle" or "generating"
        in their last heartbeat), as {producer id: host}."""
        st = self._state
        with st.lock:
            return {p: v.host for p, v in st.producers.items() if v.state in ("idle", "generating")}

    def announce_snapshot(self, info: wire.SnapshotInfo) -> None:
        """A new snapshot is complete on disk: serve it and announce it."""
        self._call(lambda: self._publish(info)).result()

    def expire_open(self, reason: str) -> None:
        """End every open lease as expired (their prompts are leased again after a resume), and
        every open eval lease (consumer/evaluation/rounds.py)."""
        st = self._state

        def expire() -> None:
            st.book.expire_all(reason)
            if st.evals is not None:
                st.evals.expire_all()

        self._call(expire).result()

    def flush_ledger(self) -> None:
        """Append finished leases to leases.jsonl, rewrite ledger.json and the producers'
        files (consumer/server/roster.py)."""
        self._call(self._books.flush).result().result()  # handed over, then written

    def wait_books(self) -> None:
        """Wait until what the network thread handed its writer so far is on disk (finished
        leases in leases.jsonl: a settled step's are written shortly after `settle_trained`)."""
        self._call(self._books.written).result().result()

    def step_summary(self) -> RF.StepSummary:
        """What a step's metrics line needs, its size independent of the number of
        producers: the ledger's counts in total (LeaseBook.totals), messages refused so far,
        the producers by state as of the last roster write and the backpressure figures since
        the last summary (`Admission.summary`)."""
        st = self._state

        def summary() -> RF.StepSummary:
            census = self._books.census
            return RF.StepSummary(
                totals=st.book.totals(),
                rejected_messages=st.counters.get("rejected", 0),
                producers_live=census.live,
                producers_by_state=census.by_state,
                backpressure=st.admission.summary(reset=True),
            )

        return self._call(summary).result()

    def take_eval(self, *, last: bool = False) -> dict[str, Any]:
        """For a step's metrics line: the eval counters, and the oldest finished eval round's
        result not taken yet (consumer/evaluation/rounds.py; the newest for the run's `last`
        line); {} with evaluation off."""
        evals = self._state.evals
        if evals is None:
            return {}

        def take() -> dict[str, Any]:
            return {**evals.totals(), **(evals.take_result(newest=last) or {})}

        return self._call(take).result()

    def await_round(self, version: int, timeout_s: float, stop: threading.Event) -> bool:
        """Wait until the eval round of `version` has been begun and has ended, at most
        `timeout_s` and not once `stop` is set; whether it ended (True with evaluation off)."""
        evals = self._state.evals
        if evals is None:
            return True
        deadline = time.monotonic() + timeout_s
        while not self._call(lambda: evals.ended(version)).result():
            if time.monotonic() >= deadline or stop.wait(0.05):
                return False
        return True

    def balance(self) -> RF.Balance:
        """The ledger's counts by state; `ok` when they add up (see LeaseBook.balance)."""
        return self._call(self._state.book.balance).result()

    def starving(self) -> bool:
        """True when prompts ran out and no lease is open: no group will ever arrive."""
        book = self._state.book
        return self._call(lambda: book.order.exhausted() and not book.open).result()

    def checkpoint_state(self, logs: Sequence[str]) -> RF.BookState:
        """The lease book's state for a checkpoint, taken after writing the ledger, with the
        sizes of the run-directory files `logs` at that moment, so that a resumed run truncates
        its append-only logs to exactly this state."""

        def state() -> tuple[Future[int], RF.BookState]:
            written = self._books.flush()
            return written, RF.BookState(
                book=self._state.book.state_dict(),
                identities=self._state.identities.state_dict(),
                log_sizes={name: size_of(self.run_dir / name) for name in logs},
            )

        written, book_state = self._call(state).result()
        leases_size = written.result()  # the books as of that state, written off this thread
        if RF.LEASES in book_state.log_sizes:  # as the writer left it, not as it is later
            book_state.log_sizes[RF.LEASES] = leases_size
        return book_state

    def all_told_finished(self) -> bool:
        """Every live producer (and every producer of the previous incarnation that has not
        re-registered yet) has heard that the run is finished, and each live one has said
        goodbye or heard it `GOODBYE_WAIT_S` ago (its goodbye is answered, not left to time
        out: producers of a crowd hear the end together, their parked requests answered)."""
        return self._call(self._all_told_finished).result()

    def _all_told_finished(self) -> bool:
        st, now = self._state, time.monotonic()
        live = {p for p, v in st.producers.items() if v.state not in ("gone", "left")}
        told = st.told_finished
        if not live | (st.expected - set(st.producers)) <= told.keys():
            return False
        return all(now - told[p] >= GOODBYE_WAIT_S for p in live)

    def heartbeat_timing(self) -> tuple[float, float]:
        """(the longest heartbeat period sent lately, the silence after which a producer is
        gone), in seconds (consumer/server/liveness.py: `SentPeriods`); read, not called, so
        it answers while the network thread is busy."""
        st = self._state
        return st.periods.longest_s, st.producer_timeout_s()

    def awaiting_restored(self) -> bool:
        """True while a producer of the previous incarnation has not registered with this one
        (after a resume it may still be waiting out a request to the old consumer)."""
        st = self._state
        return self._call(lambda: bool(st.expected - set(st.producers))).result()

    def _fail_on_error(self, fut: Future[Any]) -> None:
        """A call nobody waits for failed: the lease book can no longer be trusted, so the
        network thread stops as if it had failed itself (`check` re-raises it)."""
        exc = fut.exception() if not fut.cancelled() else None
        if exc is not None and self._loop.error is None:
            log.error("a call from the training thread failed on the network thread: %r", exc)
            self._loop.fail(exc)

    def check(self) -> None:
        """Re-raise, on the caller's thread, a failure of the network thread."""
        if self.error is not None:
            raise RuntimeError("the consumer's network thread failed") from self.error

    def view(self) -> dict[str, Any]:
        """A consistent copy of the counters and producers (for metrics and the dashboard)."""
        st = self._state
        with st.lock:
            return {
                "counters": dict(st.counters),
                "producers": {k: asdict(v) for k, v in st.producers.items()},
            }

    # -- on the network thread -----------------------------------------------------------------
    def _publish(self, info: wire.SnapshotInfo) -> None:
        st = self._state
        st.snapshot = info
        if st.evals is not None and st.accepting and st.evals.due(info.version):
            st.evals.schedule(info.version, now=time.monotonic())
        self._announce.send(wire.encode(wire.Announce(st.run_id, st.policy_version, info)))


def _restored_state(
    cfg: Config,
    prompts: PromptSource,
    book_state: RF.BookState | None,
    policy_version: int,
    hold_grants: bool,
) -> NetState:
    """The network thread's books at start: a fresh lease book over `prompts`, or the one of
    `book_state` (a checkpoint's) as its next incarnation, with its producers' identities."""
    order = PromptOrder(
        len(prompts), seed=cfg.run.seed, shuffle=cfg.task.shuffle, epochs=cfg.task.epochs
    )
    book = LeaseBook(
        order,
        prompts_per_step=cfg.train.prompts_per_step,
        max_staleness=cfg.staleness.max_staleness,
    )
    identities = Identities()
    if book_state is not None:
        book.load_state_dict(book_state.book, now=time.monotonic())
        identities.load_state_dict(book_state.identities)
    net = cfg.net
    admission = Admission(
        max_bytes=int(net.max_queued_mib * (1 << 20)), max_groups=net.max_queued_groups
    )
    return NetState(
        cfg,
        prompts=prompts,
        book=book,
        identities=identities,
        admission=admission,
        run_id=f"{uuid.uuid4().hex[:8]}-{book.incarnation}",
        policy_version=policy_version,
        granting=not hold_grants,
    )
