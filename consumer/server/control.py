"""Requests on the control socket, on the network thread: registration, heartbeats, lease
requests, fetch plans and reports (consumer/snapshots/fanout.py), goodbyes; and the pushes that
tell producers to send the groups they hold.

Invariants:
- Identity (consumer/server/identity.py): a registration binds its producer id to the CurveZMQ
  key of its connection; heartbeats, lease requests, goodbyes and fetch messages for that id are
  accepted only with that key (`wrong_key`), and only from a registered id (`not_registered`).
- A bad request is counted under `control_rejected.<reason>` and answered with a `wire.Reject`;
  whatever handling it raises, even a bug of ours, is counted (`NetState.internal_error`) and
  answered `internal_error`. Replies are sent without blocking; a lost reply only delays acks.
- Eval leases (consumer/evaluation/rounds.py) are granted before training leases, and only for
  the version the request says its producer holds; the eval leases a request gives back
  (`declined`) and those a registration or goodbye does not name end there, not in the ledger.
- A lease request that cannot be granted is parked (consumer/server/parked.py), not answered.
- A held group released by the learner's room is asked for at once (`release`): a status reply
  with req 0 pushed over its producer's control connection, not left for its next request.
- Leases are granted only while the run accepts groups, grants are open (`Server.open_grants`)
  and a snapshot is published. A lease carries its prompt's row (prompt, answer, columns: at
  most `task.max_row_kib`, at most half a message); one grant holds no more leases than half a
  message fits with the data's largest row, so every grant fits in the producer's message limit.
- Bounded per peer: at most `MAX_PRODUCERS` producer records (a registration of one more id is
  refused, `too_many_producers`, until gone ones are forgotten: consumer/server/loop.py, which
  prunes every record of a producer it forgets, here with `forget`).
"""

from __future__ import annotations

import logging
import time

import zmq

from common import wire
from common.errors import WireError
from consumer.data.rows import PromptRow
from consumer.server.parked import ParkedRequests
from consumer.server.state import NetState, ProducerView, peer_key
from consumer.snapshots.fanout import FanOut

log = logging.getLogger("asyncgrpo.consumer")
_LEASE_OVERHEAD_BYTES = 256  # a lease's other fields and msgpack headers, rounded up
MAX_PRODUCERS = 1 << 14  # producer ids with a record at once (their views, routes, relays, ...)


class Control:
    """The handler of the control ROUTER `sock` (its requests decoded with `limits`); owns the
    parked lease requests and answers fetch requests with `fanout`'s plans."""

    def __init__(
        self,
        state: NetState,
        sock: zmq.Socket[bytes],
        *,
        spec: wire.RunSpec,
        limits: wire.Limits,
        fanout: FanOut,
    ) -> None:
        self._state, self.sock, self.spec, self.limits = state, sock, spec, limits
        self._fanout = fanout
        self._eval_row_bytes = max((r.num_bytes for r in state.eval_rows), default=0)
        self.parked = ParkedRequests(state, grant=self.grant, reply=self.reply)

    def on_frames(self, frames: list[zmq.Frame]) -> None:
        st = self._state
        if len(frames) != 2:
            st.count("control_rejected.multipart")
            return
        identity, payload = frames
        t0 = time.perf_counter()
        req = 0  # unknown until the request parses
        reply: wire.Message | None
        msg: wire.Message | None = None
        try:
            msg = wire.decode(payload.buffer, self.limits)
            req = getattr(msg, "req", 0)
            reply = self.handle(msg, peer_key(payload), identity.bytes)
        except WireError as exc:
            st.count(f"control_rejected.{exc.reason}")
            st.log.log(
                f"control.{exc.reason}", logging.WARNING, "rejected a control request: %s", exc
            )
            reply = wire.Reject(req=req, reason=exc.reason, detail=exc.detail)
        except Exception as exc:  # a bug of ours: counted and logged; the peer is told
            st.internal_error(exc)
            reply = wire.Reject(req=req, reason="internal_error", detail=type(exc).__name__)
        if reply is not None:  # None: a parked lease request, answered later
            self.reply(identity.bytes, reply)
        timing = st.timing
        timing.control_messages += 1
        if isinstance(msg, wire.LeaseRequest):  # the consumer's part of its round trip
            timing.lease_requests += 1
            if reply is None:
                timing.lease_parked += 1
            else:
                timing.lease_service.record(time.perf_counter() - t0)
        elif isinstance(msg, wire.Heartbeat):
            timing.heartbeats += 1

    def reply(self, identity: bytes, reply: wire.Message) -> None:
        try:
            self.sock.send_multipart([identity, wire.encode(reply)], zmq.NOBLOCK)
        except zmq.ZMQError:  # peer gone (ROUTER_MANDATORY) or its pipe full: it will retry
            self._state.count("control_reply_undeliverable")

    def handle(self, msg: wire.Message, key: str, identity: bytes) -> wire.Message | None:
        """The reply to one control request that came with the CurveZMQ key `key` over the
        connection `identity`; None when it is a lease request parked until leases free up."""
        now = time.monotonic()
        if isinstance(msg, wire.Register):
            return self._register(msg, key, now)
        if not isinstance(
            msg,
            wire.Heartbeat | wire.LeaseRequest | wire.Goodbye | wire.FetchRequest | wire.FetchDone,
        ):
            raise WireError("unexpected_kind", type(msg).__name__)
        st = self._state
        view = st.producers.get(msg.producer_id)
        if view is None or view.state == "gone":
            raise WireError("not_registered", "register first (the consumer may have restarted)")
        if not st.identities.allows(msg.producer_id, key):
            raise WireError("wrong_key", "this producer id is registered with another key")
        st.route(msg.producer_id, identity)
        st.liveness.heard(msg.producer_id, now)
        with st.lock:
            view.last_seen = now
            if isinstance(msg, wire.Heartbeat):  # its counters held as decoded, not copied
                view.loaded_version, view.state = msg.loaded_version, msg.state
                view.num_in_flight, view.counters = msg.num_in_flight, msg.counters
                st.note(msg.producer_id)
        if isinstance(msg, wire.Goodbye):
            self.parked.unpark(msg.producer_id)
            # after the end of the run a producer drops the leases it was running: they end
            # as the shutdown ends every open lease, whichever comes first
            reason = "not held" if st.accepting else "shutdown"
            st.book.reconcile(msg.producer_id, set(msg.held_leases), reason=reason)
            if st.evals is not None:
                st.evals.reconcile(msg.producer_id, set(msg.held_leases))
            with st.lock:
                view.state, view.last_seen, view.ended_at = "left", float("inf"), now
            st.liveness.ended(msg.producer_id, now)
            st.note(msg.producer_id)
            return wire.StatusReply(msg.req, st.status(msg.producer_id))
        if isinstance(msg, wire.FetchRequest):
            return self._fanout.plan(msg, now)
        if isinstance(msg, wire.FetchDone):
            self._fanout.done(msg)
            return wire.StatusReply(msg.req, st.status(msg.producer_id))
        if isinstance(msg, wire.LeaseRequest):
            return self._lease_request(msg, view, identity, now)
        return wire.StatusReply(msg.req, st.status(msg.producer_id))

    def _register(self, msg: wire.Register, key: str, now: float) -> wire.Welcome:
        st = self._state
        view = st.producers.get(msg.producer_id)
        if view is None and len(st.producers) >= MAX_PRODUCERS:
            raise WireError("too_many_producers", f"{MAX_PRODUCERS} producer ids are registered")
        free = view is None or (
            view.state in ("gone", "left") and not st.book.holds(msg.producer_id)
        )
        if not st.identities.bind(msg.producer_id, key, free=free):
            raise WireError("wrong_key", "this producer id is registered with another key")
        st.register(
            msg.producer_id,
            ProducerView(msg.host, msg.pid, msg.engine, msg.loaded_version, last_seen=now),
        )
        st.liveness.registered(msg.producer_id, now)
        st.book.touch(msg.producer_id)  # its host in ledger.json
        st.book.reconcile(msg.producer_id, set(msg.held_leases))
        if st.evals is not None:
            st.evals.reconcile(msg.producer_id, set(msg.held_leases))
        self.parked.unpark(msg.producer_id)
        log.info(
            "producer %s registered (%s pid %d, %s)",
            msg.producer_id,
            msg.host,
            msg.pid,
            msg.engine,
        )
        return wire.Welcome(msg.req, self.spec, st.status(msg.producer_id))

    def _lease_request(
        self, msg: wire.LeaseRequest, view: ProducerView, identity: bytes, now: float
    ) -> wire.LeaseGrant | None:
        st = self._state
        with st.lock:
            if view.loaded_version != msg.loaded_version:
                view.loaded_version = msg.loaded_version
                st.note(msg.producer_id)
        if msg.declined and st.evals is not None:
            st.evals.decline(msg.producer_id, msg.declined)
        self.parked.unpark(msg.producer_id)  # its older request (it gave up on it) goes first
        leases = self.grant(msg, now)
        wait_s = st.cfg.net.lease_wait_s  # or longer, when the producer waits longer (a crowd)
        if not leases and st.accepting and wait_s > 0:
            self.parked.park(identity, msg, now + max(wait_s, msg.wait_s))
            return None
        if not leases:
            st.count("lease_replies_empty")
        return wire.LeaseGrant(msg.req, leases, st.status(msg.producer_id))

    def forget(self, producer_id: str) -> None:
        """Drop what this side keeps of a producer the server forgets (consumer/server/loop.py)."""
        self.parked.drop(producer_id)
        self._fanout.forget(producer_id)

    def grant(
        self, msg: wire.LeaseRequest, now: float, limit: int = wire.MAX_LEASES_PER_GRANT
    ) -> tuple[wire.Lease, ...]:
        """Up to `min(msg.max_leases, limit)` new leases for `msg`'s producer (maybe none; never
        more than one grant carries: common/wire/sizes.py), and no more than fit in half a message
        with the largest rows of the data (a row is at most half a message: config check)."""
        st = self._state
        if not st.accepting or not st.granting or st.snapshot is None:
            return ()
        half_message = int(st.cfg.net.max_message_mib * (1 << 20)) // 2
        row_bytes = max(st.prompts.max_row_bytes, self._eval_row_bytes)
        fit = max(1, half_message // (row_bytes + _LEASE_OVERHEAD_BYTES))
        cap = max(0, min(limit, wire.MAX_LEASES_PER_GRANT, fit))  # one grant's leases
        room = min(msg.max_leases, cap)  # training slots
        # eval leases first: they wait for nothing but a version. A producer that holds the
        # round's version asks for them beyond its training slots (`max_eval_leases`); else
        # they take training slots
        beyond = msg.max_eval_leases > 0
        out = self._eval_leases(msg, min(msg.max_eval_leases if beyond else room, cap), now)
        records = st.book.grant(
            msg.producer_id,
            max(0, min(room, cap - len(out)) if beyond else room - len(out)),
            policy_version=st.policy_version,
            published_version=st.snapshot.version,
            now=now,
        )
        for r in records:
            row = st.prompts.get(r.prompt_index)
            out.append(
                _lease(r.lease_id, r.prompt_index, row, step=r.step, min_version=r.min_version)
            )
        return tuple(out)

    def _eval_leases(self, msg: wire.LeaseRequest, room: int, now: float) -> list[wire.Lease]:
        """Up to `room` eval leases for the version `msg`'s producer holds."""
        evals, rows = self._state.evals, self._state.eval_rows
        if evals is None or room <= 0:
            return []
        out = []
        for e in evals.grant(msg.producer_id, msg.loaded_version, room, now=now):
            row, v = rows[e.prompt_index], e.version
            out.append(
                _lease(e.lease_id, e.prompt_index, row, step=v, min_version=v, eval_version=v)
            )
        return out

    def release(self, released: list[tuple[str, int]]) -> None:
        """Tell the producers of `released` (producer id, lease id) to send those groups now:
        a status pushed over each one's control connection (its acks put back if that fails,
        for its next request to take)."""
        st = self._state
        for lease_id in (lease for _, lease in released):
            st.book.release(lease_id)
        for producer_id in dict.fromkeys(p for p, _ in released):
            identity = st.routes.get(producer_id)
            if identity is None:
                continue
            status = st.status(producer_id)
            try:
                push = wire.StatusReply(0, status)
                self.sock.send_multipart([identity, wire.encode(push)], zmq.NOBLOCK)
            except zmq.ZMQError:  # it reconnected or its pipe is full: its next request
                st.book.requeue_acks(producer_id, status.acks)
                st.count("control_push_undeliverable")


def _lease(
    lease_id: int,
    prompt_index: int,
    row: PromptRow,
    *,
    step: int,
    min_version: int,
    eval_version: int = -1,
) -> wire.Lease:
    """A lease carrying `row` (its prompt, answer, chat messages and other columns)."""
    return wire.Lease(
        lease_id=lease_id,
        prompt_index=prompt_index,
        step=step,
        min_version=min_version,
        prompt=row.prompt,
        answer=row.answer,
        messages=row.messages,
        columns=row.columns,
        eval_version=eval_version,
    )
