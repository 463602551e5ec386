"""The consumer's network side: one thread that owns every socket and the lease book.

Sockets (all bound here): `control` ROUTER (register, heartbeat, lease requests, fetch plans
and reports (consumer/snapshots/fanout.py), goodbye), `rollouts` PULL (groups), `announce` PUB (new
snapshot versions, hints only). Snapshot chunks are served on the `data` ROUTER by its own
thread (consumer/snapshots/dataplane.py, started and stopped with this one), so control never waits
behind bulk bytes.

Invariants:
- Only this thread touches the sockets and the lease book (`LeaseBook`, private to this module:
  the server builds it, restores it on resume and hands out only copies of its state). Other
  threads use the typed methods under "API for other threads" (each runs its work here, between
  socket events, through a queue of callables answered by futures) and receive admitted groups
  through `next_group`: a queue bounded in groups and bytes (`net.max_queued_groups`,
  `net.max_queued_mib`; consumer/server/admission.py). A valid group that does not fit is not
  admitted: its lease is `held` and its producer told to hold it, then to send it when the
  learner has made room (acks `hold` / `send`; a `send` is pushed to the producer at once, a
  status reply with req 0 over its control connection, not left for its next request). The
  rollouts socket is always read, so ZeroMQ's queues never grow with a slow learner.
- A bad message is counted under `rejected.<reason>` (`control_rejected.<reason>` on control)
  and never raises out of the loop: whatever handling a message raises, even a bug of ours, is
  counted as `rejected.internal_error` (and `internal_error.<exception type>`), logged with its
  traceback the first time, and the loop goes on. Log lines about bad messages are rate-limited
  per reason (common/log_limit.py): a flood of garbage is counted, not written out line by line.
  A group that parsed but failed validation ends its lease as `rejected_invalid` and the
  producer is told (ack with that outcome). Replies are sent without blocking; a lost reply only
  delays acks.
- Identity (consumer/server/identity.py): a registration binds its producer id to the CurveZMQ key
  of its connection; heartbeats, lease requests, goodbyes and groups for that id are accepted only
  with that key (`wrong_key`), and only from a registered id (`not_registered`). A group for an
  open lease of another producer is refused (`rejected.wrong_producer`): it is neither trained
  nor credited, and the lease stays with its holder. Records of producers that left or went
  silent, holding no lease, are forgotten after `_FORGET_AFTER_S` (with their acks).
- Every reply carries the newest policy and snapshot version (a missed announcement costs
  latency, never correctness) and the acks queued for that producer.
- A lease request that cannot be granted is parked, not answered empty: it gets its grant the
  moment leases free up (a step settled, a snapshot published, a lease dropped or expired), or
  an empty reply after `net.lease_wait_s`, or a finished one when the run ends. Parked requests
  are served first come, first served (one per producer: a newer one answers the older empty),
  so a starved producer costs one request per `net.lease_wait_s`, not one per round trip, and
  serving them costs one lease-book query when nothing is free, whatever their number.
- Calls from other threads wake the loop at once (a socket pair in its poller), so the training
  thread never waits out a poll timeout.
- Built with `hold_grants`, the server grants no lease until `open_grants()` (the learner waits
  for `run.wait_for_producers` ready producers first: `ready_producers`).
- `ledger.json` names the host of every producer that held a lease (`hosts`).
- Nothing per step grows with the number of producers: a settled step appends its finished
  leases to leases.jsonl; ledger.json (counts, per producer) and the producers' files
  (consumer/server/roster.py) are rewritten by housekeeping at most every `_BOOKS_EVERY_S`, and at
  once by `flush_ledger` / `checkpoint_state`; `step_summary` is a fixed-size answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import queue
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import zmq

from common import wire
from common.config import Config
from common.errors import WireError
from common.keys import Keys
from common.log_limit import LogLimiter
from common.sockets import server_socket
from consumer.server.admission import Admission
from consumer.server.identity import Identities
from consumer.server.leases import LeaseBook
from consumer.server.prompts import PromptOrder, PromptSource
from consumer.server.roster import Roster
from consumer.snapshots.dataplane import DataPlane
from consumer.snapshots.fanout import FanOut
from consumer.snapshots.fetch_files import snapshot_chunk_bytes

log = logging.getLogger("asyncgrpo.consumer")
T = TypeVar("T")
_FORGET_AFTER_S = 600.0  # a producer record that left or went silent, holding no lease
_BOOKS_EVERY_S = 2.0  # ledger.json and the producers' files: rewritten at most this often


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
    counters: dict[str, float] = field(default_factory=dict)
    ended_at: float = 0.0  # monotonic time it left or went silent (state "left" or "gone")


@dataclass(slots=True)
class _Parked:
    """A lease request waiting for leases: who asked (ROUTER identity), what, and until when."""

    identity: bytes
    msg: wire.LeaseRequest
    deadline: float  # monotonic seconds: answered empty then


def run_spec(cfg: Config, *, vocab_size: int, model: str) -> wire.RunSpec:
    """What every producer is told at registration; ports stay 0 until the server has bound."""
    s = cfg.sampling
    return wire.RunSpec(
        group_size=s.group_size,
        vocab_size=vocab_size,
        max_staleness=cfg.staleness.max_staleness,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        max_new_tokens=s.max_new_tokens,
        prompt_format=cfg.task.prompt_format,
        model=model,
        rollouts_port=0,
        announce_port=0,
        heartbeat_s=cfg.net.heartbeat_s,
        max_message_bytes=int(cfg.net.max_message_mib * (1 << 20)),
        reward_fns=tuple(wire.RewardWeight(r.fn, r.weight) for r in cfg.rewards.fns),
        reward_timeout_s=cfg.rewards.timeout_s,
        data_port=0,
    )


class Server:
    """The network thread and its lease book. Build it, `start()` it, `stop()` it.

    `book_state` (from a checkpoint) restores the lease book as the next incarnation;
    `policy_version` is the learner's version at start.
    """

    def __init__(
        self,
        cfg: Config,
        ctx: zmq.Context,
        *,
        prompts: PromptSource,
        spec: wire.RunSpec,
        run_dir: Path,
        keys: Keys | None,
        policy_version: int = 0,
        book_state: dict[str, Any] | None = None,
        hold_grants: bool = False,
        refused_keys: Callable[[], int] | None = None,
    ) -> None:
        self.cfg, self.prompts = cfg, prompts
        self._refused_keys = refused_keys  # CurveZMQ connections refused (consumer/key_gate.py)
        self.snapshot_root, self.run_dir = run_dir / "snapshots", run_dir
        order = PromptOrder(
            len(prompts), seed=cfg.run.seed, shuffle=cfg.task.shuffle, epochs=cfg.task.epochs
        )
        self._book = LeaseBook(
            order,
            prompts_per_step=cfg.train.prompts_per_step,
            max_staleness=cfg.staleness.max_staleness,
        )
        self._identities = Identities()
        if book_state is not None:
            self._book.load_state_dict(book_state, now=time.monotonic())
            self._identities.load_state_dict(book_state.get("identities", {}))
        # producers of the previous incarnation: they re-register by themselves, and should hear
        # the end of the run too if it comes before they have
        self._expected = set(self._identities.keys)
        self.incarnation = self._book.incarnation
        self.run_id = f"{uuid.uuid4().hex[:8]}-{self.incarnation}"
        net = cfg.net
        max_bytes = int(net.max_message_mib * (1 << 20))
        common = dict(
            host=net.bind_host, keys=keys, insecure=net.insecure, max_message_bytes=max_bytes
        )
        self.control, control_port = server_socket(ctx, zmq.ROUTER, port=net.control_port, **common)
        self.rollouts, rollouts_port = server_socket(
            ctx, zmq.PULL, port=net.rollouts_port, **common
        )
        self.announce, announce_port = server_socket(ctx, zmq.PUB, port=net.announce_port, **common)
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()  # guards counters/producers copies for other threads
        self.data = DataPlane(
            self.snapshot_root, host=net.bind_host, port=net.data_port, keys=keys,
            insecure=net.insecure, chunk_limit=snapshot_chunk_bytes(cfg), count=self._count,
        )  # fmt: skip
        self.ports = {
            "control": control_port, "rollouts": rollouts_port, "announce": announce_port,
            "data": self.data.port,
        }  # fmt: skip
        self.spec = dataclasses.replace(
            spec, rollouts_port=rollouts_port, announce_port=announce_port, data_port=self.data.port
        )
        s = cfg.sampling
        self.group_limits = wire.Limits(
            max_message_bytes=max_bytes,
            vocab_size=spec.vocab_size,
            group_size=s.group_size,
            temperature=s.temperature,
            max_prompt_tokens=s.max_prompt_tokens,
            max_completion_tokens=s.max_new_tokens,
        )
        self.control_limits = wire.Limits(max_message_bytes=1 << 20, max_items=1 << 16)
        self._admission = Admission(
            max_bytes=int(net.max_queued_mib * (1 << 20)), max_groups=net.max_queued_groups
        )
        self.policy_version = policy_version
        self.snapshot: wire.SnapshotInfo | None = None
        self.accepting = True  # False once the learner needs no more groups
        self.granting = not hold_grants  # False until open_grants() when held
        self._hosts: dict[str, str] = {}  # producer id -> host it registered from
        self.told_finished: set[str] = set()  # producers whose last reply said finished
        self._fanout = FanOut(
            self.snapshot_root, max_children=cfg.snapshot.fanout, count=self._count
        )
        self._log = LogLimiter(log)
        self.producers: dict[str, ProducerView] = {}
        self._calls: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._wake_recv, self._wake_send = socket.socketpair()  # a call is queued: poll returns
        self._wake_recv.setblocking(False)
        self._wake_send.setblocking(False)
        self._parked: dict[str, _Parked] = {}  # by producer id, oldest first
        self._routes: dict[str, bytes] = {}  # producer id -> ROUTER identity of its last request
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="consumer-net", daemon=True)
        self._ledger_dirty = True
        self._ledger_due = 0.0  # monotonic time ledger.json may be rewritten again
        self._roster = Roster(run_dir, every_s=_BOOKS_EVERY_S)
        self.error: BaseException | None = None  # why the network thread died, if it did

    # -- API for other threads -----------------------------------------------------------------
    def start(self) -> None:
        self.data.start()
        self._thread.start()

    def _call(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the network thread (between socket events); its result via the future."""
        fut: Future[T] = Future()
        if self.error is not None or (
            self._thread.ident is not None and not self._thread.is_alive()
        ):
            fut.set_exception(RuntimeError("the consumer's network thread has stopped"))
            return fut
        self._calls.put((fn, fut))
        # OSError: already full of wake-ups (the loop will run), or the thread has ended
        with contextlib.suppress(OSError):
            self._wake_send.send(b"\0")
        return fut

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.data.stop()

    def next_group(self, timeout_s: float) -> wire.Group | None:
        """The next admitted group, or None after `timeout_s` without one."""
        return self._admission.get(timeout_s)

    def drop(self, group: wire.Group, outcome: str) -> None:
        """End `group`'s lease as `outcome` (a dropped_* state) without waiting: its slot is
        granted again as soon as the network thread gets to it. A failure (a lease-book bug)
        stops the network thread and reaches the caller through `check`."""
        info = {"behavior_version": group.behavior_version, "num_tokens": group.num_tokens}
        fut = self._call(lambda: self._book.finalize(group.lease_id, outcome, **info))
        fut.add_done_callback(self._fail_on_error)

    def settle_trained(self, groups: Sequence[wire.Group], *, trained_step: int) -> None:
        """The optimizer step `trained_step` consumed `groups`: end their leases as trained,
        move the policy version to `trained_step + 1` (new leases follow it) and append them
        to leases.jsonl, all at once (ledger.json follows within `_BOOKS_EVERY_S`)."""

        def settle() -> None:
            for g in groups:
                self._book.finalize(
                    g.lease_id,
                    "trained",
                    behavior_version=g.behavior_version,
                    trained_step=trained_step,
                    num_tokens=g.num_tokens,
                )
            self.policy_version = trained_step + 1
            self._append_finished()
            self._ledger_dirty = True

        self._call(settle).result()

    def stop_granting(self) -> None:
        """No more leases; every reply from now on tells producers the run is finished."""

        def stop() -> None:
            self.accepting = False

        self._call(stop).result()

    def open_grants(self) -> None:
        """Start granting leases (a server built with `hold_grants`)."""

        def start() -> None:
            self.granting = True

        self._call(start).result()

    def ready_producers(self) -> dict[str, str]:
        """Producers registered and holding this run's newest snapshot ("idle" or "generating"
        in their last heartbeat), as {producer id: host}."""
        with self._lock:
            return {
                p: v.host for p, v in self.producers.items() if v.state in ("idle", "generating")
            }

    def announce_snapshot(self, info: wire.SnapshotInfo) -> None:
        """A new snapshot is complete on disk: serve it and announce it."""
        self._call(lambda: self._publish(info)).result()

    def expire_open(self, reason: str) -> None:
        """End every open lease as expired (their prompts are leased again after a resume)."""
        self._call(lambda: self._book.expire_all(reason)).result()

    def flush_ledger(self) -> None:
        """Append finished leases to leases.jsonl, rewrite ledger.json and the producers'
        files (consumer/server/roster.py)."""

        def flush() -> None:
            self._flush_ledger()
            self._roster.write(self.producers)

        self._call(flush).result()

    def step_summary(self) -> dict[str, Any]:
        """What a step's metrics line needs, its size independent of the number of
        producers: the ledger's counts in total (`balance`: LeaseBook.totals), messages refused
        so far (`rejected`), the producers by state as of the last roster write
        (`producers_live`, `producers_by_state`) and the backpressure figures since the last
        summary (`Admission.summary`)."""

        def summary() -> dict[str, Any]:
            return {
                "balance": self._book.totals(),
                "rejected": self.counters.get("rejected", 0),
                **self._roster.summary,
                "admission": self._admission.summary(reset=True),
            }

        return self._call(summary).result()

    def balance(self) -> dict[str, int]:
        """The ledger's counts by state; `ok` is 1 when they add up (see LeaseBook.balance)."""
        return self._call(self._book.balance).result()

    def starving(self) -> bool:
        """True when prompts ran out and no lease is open: no group will ever arrive."""
        return self._call(lambda: self._book.order.exhausted() and not self._book.open).result()

    def checkpoint_state(self, logs: Sequence[str]) -> dict[str, Any]:
        """The lease book's state for a checkpoint, taken after writing the ledger, with the
        sizes of the run-directory files `logs` at that moment (`{"logs": {name: bytes}}`), so
        that a resumed run truncates its append-only logs to exactly this state."""

        def state() -> dict[str, Any]:
            self._flush_ledger()
            out = self._book.state_dict()
            out["identities"] = self._identities.state_dict()
            out["logs"] = {name: _size(self.run_dir / name) for name in logs}
            return out

        return self._call(state).result()

    def all_told_finished(self) -> bool:
        """Every live producer (and every producer of the previous incarnation that has not
        re-registered yet) has heard that the run is finished."""
        return self._call(self._all_told_finished).result()

    def _all_told_finished(self) -> bool:
        live = {p for p, v in self.producers.items() if v.state not in ("gone", "left")}
        return live | (self._expected - set(self.producers)) <= self.told_finished

    def awaiting_restored(self) -> bool:
        """True while a producer of the previous incarnation has not registered with this one
        (after a resume it may still be waiting out a request to the old consumer)."""
        return self._call(lambda: bool(self._expected - set(self.producers))).result()

    def _fail_on_error(self, fut: Future[Any]) -> None:
        """A call nobody waits for failed: the lease book can no longer be trusted, so the
        network thread stops as if it had failed itself (`check` re-raises it)."""
        exc = fut.exception() if not fut.cancelled() else None
        if exc is not None and self.error is None:
            log.error("a call from the training thread failed on the network thread: %r", exc)
            self.error = exc
            self._stop.set()

    def check(self) -> None:
        """Re-raise, on the caller's thread, a failure of the network thread."""
        if self.error is not None:
            raise RuntimeError("the consumer's network thread failed") from self.error

    def view(self) -> dict[str, Any]:
        """A consistent copy of the counters and producers (for metrics and the dashboard)."""
        with self._lock:
            return {
                "counters": dict(self.counters),
                "producers": {k: asdict(v) for k, v in self.producers.items()},
            }

    # -- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.control, zmq.POLLIN)
        poller.register(self.rollouts, zmq.POLLIN)
        wake_fd = self._wake_recv.fileno()
        poller.register(wake_fd, zmq.POLLIN)
        next_housekeeping = 0.0
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(timeout=10))
                if self.rollouts in events:
                    self._drain(self.rollouts, self._on_group_frames)
                if self.control in events:
                    self._drain(self.control, self._on_control_frames)
                if wake_fd in events:
                    self._take_wake_ups()
                self._run_calls()
                now = time.monotonic()
                if self._parked:
                    self._serve_parked(now)
                self._release(self._admission.release())  # the learner made room
                if now >= next_housekeeping:
                    self._housekeeping(now)
                    next_housekeeping = now + 0.25
            self._run_calls()
            self._flush_ledger()
            self._roster.write(self.producers)
        except BaseException as exc:
            log.exception("network thread failed")
            self.error = exc
            while not self._calls.empty():
                self._calls.get_nowait()[1].set_exception(RuntimeError("network thread failed"))
            raise
        finally:
            for sock in (self.control, self.rollouts, self.announce):
                sock.close(linger=0)
            self._wake_recv.close()
            self._wake_send.close()

    def _take_wake_ups(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_recv.recv(4096):
                pass

    def _drain(
        self, sock: zmq.Socket, handler: Callable[[list[zmq.Frame]], None], limit: int = 256
    ) -> None:
        for _ in range(limit):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                handler(frames)
            except Exception as exc:  # one message must never end this thread
                self._internal_error(exc)

    def _internal_error(self, exc: Exception) -> None:
        """Handling one message raised: count it, log it (with its traceback the first time
        for its type) and go on; the message is dropped."""
        name = type(exc).__name__
        with self._lock:
            self.counters["rejected.internal_error"] += 1
            self.counters[f"internal_error.{name}"] += 1
            self.counters["rejected"] += 1
        self._log.log(
            f"internal_error.{name}",
            logging.ERROR,
            "a message raised %s while it was handled: dropped, the consumer goes on",
            name,
            exc_info=True,
        )

    def _run_calls(self) -> None:
        while True:
            try:
                fn, fut = self._calls.get_nowait()
            except queue.Empty:
                return
            if self.error is not None:
                fut.set_exception(RuntimeError("the consumer's network thread has stopped"))
            elif fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # delivered to the caller's thread
                    fut.set_exception(exc)

    def _housekeeping(self, now: float) -> None:
        net = self.cfg.net
        gone = {p for p, v in self.producers.items() if now - v.last_seen > net.producer_timeout_s}
        expired = self._book.expire(now=now, lease_timeout_s=net.lease_timeout_s, gone=gone)
        forget = [
            p
            for p, v in self.producers.items()
            if v.state in ("gone", "left")
            and now - v.ended_at > max(_FORGET_AFTER_S, 10 * net.producer_timeout_s)
            and not self._book.holds(p)
        ]
        with self._lock:
            for p in gone:
                log.warning(
                    "producer %s silent for %.0f s: gone, its leases expire",
                    p,
                    net.producer_timeout_s,
                )
                self.producers[p].state = "gone"
                self.producers[p].last_seen = float("inf")  # report once
                self.producers[p].ended_at = now
                self._parked.pop(p, None)  # gone: nobody to answer
            for p in forget:
                del self.producers[p]
            self.counters["expired"] += len(expired)
        for p in forget:
            if p not in self._book.by_producer:
                self._hosts.pop(p, None)
            self._book.forget_acks(p)
            self._identities.forget(p)
            self._routes.pop(p, None)
            self.told_finished.discard(p)
        if expired:
            self._append_finished()
            self._ledger_dirty = True
        self._admission.prune(self._book.open)  # held groups whose lease ended otherwise
        if self._ledger_dirty and now >= self._ledger_due:
            self._flush_ledger()
            self._ledger_due = now + _BOOKS_EVERY_S
        self._roster.maybe_write(self.producers, now)

    # -- rollouts ------------------------------------------------------------------------------
    def _on_group_frames(self, frames: list[zmq.Frame]) -> None:
        with self._lock:
            self.counters["messages"] += 1
        key = peer_key(frames[0])
        if len(frames) != 1:
            return self._reject_group(WireError("multipart", f"{len(frames)} frames"), key)
        try:
            msg = wire.decode(frames[0].buffer, self.group_limits)
        except WireError as exc:
            return self._reject_group(exc, key)
        if not isinstance(msg, wire.Group):
            return self._reject_group(WireError("unexpected_kind", type(msg).__name__), key)
        if msg.producer_id not in self.producers:
            return self._reject_group(WireError("not_registered", "register first"), key)
        if not self._identities.allows(msg.producer_id, key):
            return self._reject_group(WireError("wrong_key", "not this producer's key"), key)
        verdict = self._book.receive(msg.lease_id, msg.producer_id)
        if verdict == "wrong_producer":
            return self._reject_group(WireError("wrong_producer", "another producer's lease"), key)
        if verdict == "accept" and not self._admission.offer(
            msg, len(frames[0].buffer), now=time.monotonic()
        ):
            self._book.hold(msg.lease_id)  # no room: its producer keeps it until told to send
            verdict = "not_admitted"  # counted as groups_not_admitted
        with self._lock:
            self.counters[f"groups_{verdict}"] += 1

    def _reject_group(self, exc: WireError, key: str) -> None:
        """Count a refused group message; one that parsed but failed a check ends its lease
        as rejected_invalid, if it came from the lease's holder (id and key)."""
        with self._lock:
            self.counters[f"rejected.{exc.reason}"] += 1
            self.counters["rejected"] += 1
        self._log.log(f"group.{exc.reason}", logging.WARNING, "rejected a group message: %s", exc)
        rec = self._book.open.get(exc.lease_id) if exc.lease_id is not None else None
        if (
            rec is not None
            and rec.state in ("issued", "held")
            and rec.producer_id == exc.producer_id
            and self._identities.allows(rec.producer_id, key)
            and exc.reason not in ("not_registered", "wrong_key", "wrong_producer")
        ):
            self._book.finalize(rec.lease_id, "rejected_invalid", reason=exc.reason)
            self._ledger_dirty = True

    # -- control -------------------------------------------------------------------------------
    def _on_control_frames(self, frames: list[zmq.Frame]) -> None:
        if len(frames) != 2:
            with self._lock:
                self.counters["control_rejected.multipart"] += 1
            return
        identity, payload = frames
        req = 0  # unknown until the request parses
        try:
            msg = wire.decode(payload.buffer, self.control_limits)
            req = getattr(msg, "req", 0)
            reply = self._handle(msg, peer_key(payload), identity.bytes)
        except WireError as exc:
            with self._lock:
                self.counters[f"control_rejected.{exc.reason}"] += 1
            self._log.log(
                f"control.{exc.reason}", logging.WARNING, "rejected a control request: %s", exc
            )
            reply = wire.Reject(req=req, reason=exc.reason, detail=exc.detail)
        except Exception as exc:  # a bug of ours: counted and logged; the peer is told
            self._internal_error(exc)
            reply = wire.Reject(req=req, reason="internal_error", detail=type(exc).__name__)
        if reply is not None:  # None: a parked lease request, answered later
            self._reply(identity.bytes, reply)

    def _reply(self, identity: bytes, reply: wire.Message) -> None:
        try:
            self.control.send_multipart([identity, wire.encode(reply)], zmq.NOBLOCK)
        except zmq.ZMQError:  # peer gone (ROUTER_MANDATORY) or its pipe full: it will retry
            with self._lock:
                self.counters["control_reply_undeliverable"] += 1

    def _status(self, producer_id: str | None) -> wire.Status:
        acks = self._book.take_acks(producer_id) if producer_id else ()
        if producer_id and not self.accepting:
            self.told_finished.add(producer_id)
        return wire.Status(
            self.run_id, self.policy_version, self.snapshot, acks, not self.accepting
        )

    def _handle(self, msg: wire.Message, key: str, identity: bytes) -> wire.Message | None:
        """The reply to one control request that came with the CurveZMQ key `key` over the
        connection `identity`; None when it is a lease request parked until leases free up."""
        now = time.monotonic()
        if isinstance(msg, wire.Register):
            view = self.producers.get(msg.producer_id)
            free = view is None or (
                view.state in ("gone", "left") and not self._book.holds(msg.producer_id)
            )
            if not self._identities.bind(msg.producer_id, key, free=free):
                raise WireError("wrong_key", "this producer id is registered with another key")
            with self._lock:
                self.producers[msg.producer_id] = ProducerView(
                    msg.host, msg.pid, msg.engine, msg.loaded_version, last_seen=now
                )
            self._hosts[msg.producer_id] = msg.host
            self._book.reconcile(msg.producer_id, set(msg.held_leases))
            self._unpark(msg.producer_id)
            log.info(
                "producer %s registered (%s pid %d, %s)",
                msg.producer_id,
                msg.host,
                msg.pid,
                msg.engine,
            )
            return wire.Welcome(msg.req, self.spec, self._status(msg.producer_id))
        if not isinstance(
            msg,
            wire.Heartbeat | wire.LeaseRequest | wire.Goodbye | wire.FetchRequest | wire.FetchDone,
        ):
            raise WireError("unexpected_kind", type(msg).__name__)
        view = self.producers.get(msg.producer_id)
        if view is None or view.state == "gone":
            raise WireError("not_registered", "register first (the consumer may have restarted)")
        if not self._identities.allows(msg.producer_id, key):
            raise WireError("wrong_key", "this producer id is registered with another key")
        self._routes[msg.producer_id] = identity
        with self._lock:
            view.last_seen = now
            if isinstance(msg, wire.Heartbeat):
                view.loaded_version, view.state = msg.loaded_version, msg.state
                view.num_in_flight, view.counters = msg.num_in_flight, dict(msg.counters)
        if isinstance(msg, wire.Goodbye):
            self._unpark(msg.producer_id)
            # after the end of the run a producer drops the leases it was running: they end
            # as the shutdown ends every open lease, whichever comes first
            reason = "not held" if self.accepting else "shutdown"
            self._book.reconcile(msg.producer_id, set(msg.held_leases), reason=reason)
            with self._lock:
                view.state, view.last_seen, view.ended_at = "left", float("inf"), now
            return wire.StatusReply(msg.req, self._status(msg.producer_id))
        if isinstance(msg, wire.FetchRequest):
            return self._fanout.plan(msg, now)
        if isinstance(msg, wire.FetchDone):
            self._fanout.done(msg)
            return wire.StatusReply(msg.req, self._status(msg.producer_id))
        if isinstance(msg, wire.LeaseRequest):
            with self._lock:
                view.loaded_version = msg.loaded_version
            self._unpark(msg.producer_id)  # its older request (it gave up on it) goes first
            leases = self._grant(msg, now)
            wait_s = self.cfg.net.lease_wait_s
            if not leases and self.accepting and wait_s > 0:
                self._parked[msg.producer_id] = _Parked(identity, msg, now + wait_s)
                return None
            if not leases:
                with self._lock:
                    self.counters["lease_replies_empty"] += 1
            return wire.LeaseGrant(msg.req, leases, self._status(msg.producer_id))
        return wire.StatusReply(msg.req, self._status(msg.producer_id))

    def _release(self, released: list[tuple[str, int]]) -> None:
        """Tell the producers of `released` (producer id, lease id) to send those groups now:
        a status pushed over each one's control connection (its acks put back if that fails,
        for its next request to take)."""
        for lease_id in (lease for _, lease in released):
            self._book.release(lease_id)
        for producer_id in dict.fromkeys(p for p, _ in released):
            identity = self._routes.get(producer_id)
            if identity is None:
                continue
            status = self._status(producer_id)
            try:
                push = wire.StatusReply(0, status)
                self.control.send_multipart([identity, wire.encode(push)], zmq.NOBLOCK)
            except zmq.ZMQError:  # it reconnected or its pipe is full: its next request
                self._book.requeue_acks(producer_id, status.acks)
                with self._lock:
                    self.counters["control_push_undeliverable"] += 1

    def _unpark(self, producer_id: str) -> None:
        """Answer `producer_id`'s parked lease request, if any, empty."""
        parked = self._parked.pop(producer_id, None)
        if parked is not None:
            self._answer_parked(producer_id, parked, ())

    def _answer_parked(
        self, producer_id: str, parked: _Parked, leases: tuple[wire.Lease, ...]
    ) -> None:
        with self._lock:
            self.counters["lease_replies_parked"] += 1
            if not leases:
                self.counters["lease_replies_empty"] += 1
        status = self._status(producer_id)
        self._reply(parked.identity, wire.LeaseGrant(parked.msg.req, leases, status))

    def _serve_parked(self, now: float) -> None:
        """Grant parked requests while leases are free, one lease each in turn, oldest first
        (producers waiting together share the leases that free up, rather than the first
        taking them all); answer the overdue ones empty, and all of them once the run is
        finished. A grant does not depend on who asks, so the first that gets nothing ends it."""
        if not self.accepting:
            for producer_id, parked in list(self._parked.items()):
                del self._parked[producer_id]
                self._answer_parked(producer_id, parked, ())
            return
        got: dict[str, list[wire.Lease]] = {}
        wanting, exhausted = list(self._parked), False
        while wanting and not exhausted:
            more = []
            for producer_id in wanting:
                parked = self._parked[producer_id]
                lease = self._grant(parked.msg, now, limit=1)
                if not lease:
                    exhausted = True
                    break
                mine = got.setdefault(producer_id, [])
                mine.extend(lease)
                if len(mine) < parked.msg.max_leases:
                    more.append(producer_id)
            wanting = more
        for producer_id, leases in got.items():
            self._answer_parked(producer_id, self._parked.pop(producer_id), tuple(leases))
        while self._parked:  # the overdue, oldest first
            producer_id, parked = next(iter(self._parked.items()))
            if now < parked.deadline:
                return  # later ones were parked later: not overdue either
            del self._parked[producer_id]
            self._answer_parked(producer_id, parked, ())

    def _grant(
        self, msg: wire.LeaseRequest, now: float, limit: int = 1024
    ) -> tuple[wire.Lease, ...]:
        """Up to `min(msg.max_leases, limit)` new leases for `msg`'s producer (maybe none)."""
        if not self.accepting or not self.granting or self.snapshot is None:
            return ()
        records = self._book.grant(
            msg.producer_id,
            max(0, min(msg.max_leases, limit, 1024)),
            policy_version=self.policy_version,
            published_version=self.snapshot.version,
            now=now,
        )
        out = []
        for r in records:
            prompt, answer = self.prompts.get(r.prompt_index)
            out.append(
                wire.Lease(r.lease_id, r.prompt_index, r.step, r.min_version, prompt, answer)
            )
        if out:
            self._ledger_dirty = True
        return tuple(out)

    # -- on this thread ------------------------------------------------------------------------
    def _count(self, key: str, n: float) -> None:
        with self._lock:
            self.counters[key] += n

    def _publish(self, info: wire.SnapshotInfo) -> None:
        self.snapshot = info
        self.announce.send(wire.encode(wire.Announce(self.run_id, self.policy_version, info)))

    def _append_finished(self) -> None:
        """Append the leases finished since the last call to leases.jsonl (incremental: the
        cost of a call is the leases it writes)."""
        finished = self._book.take_finished()
        if finished:
            with open(self.run_dir / "leases.jsonl", "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in finished)

    def _flush_ledger(self) -> None:
        """Append finished leases to leases.jsonl and rewrite ledger.json (atomically)."""
        self._append_finished()
        summary = {
            "balance": self._book.balance(),
            "by_producer": {p: dict(c) for p, c in self._book.by_producer.items()},
            "hosts": {p: self._hosts.get(p, "") for p in self._book.by_producer},
            "counters": self._counters_now(),
            "admission": self._admission.run_summary(),
            "policy_version": self.policy_version,
        }
        tmp = self.run_dir / "ledger.json.tmp"
        tmp.write_text(json.dumps(summary, indent=1, sort_keys=True))
        tmp.replace(self.run_dir / "ledger.json")
        self._ledger_dirty = False

    def _counters_now(self) -> dict[str, int]:
        """The server's counters, with the key gate's refusals as `rejected.unknown_key`."""
        counters = dict(self.counters)
        refused = self._refused_keys() if self._refused_keys is not None else 0
        if refused:
            counters["rejected.unknown_key"] = refused
        return counters


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0
