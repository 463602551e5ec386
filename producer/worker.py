"""The producer's asyncio program for one consumer run: lease prompts, sample G completions,
score, send; keep the newest weights loaded.

`Producer` registers (`setup`: the run spec), then builds a `Session` (`prepare`:
producer/session.py) while heartbeats already run; producer/main.py runs its tasks in one
`asyncio.TaskGroup` (a failing task cancels the group; `close` shuts every socket and the engine):
- `replies`: the control socket's reader (producer/control.py);
- `heartbeat`: reports state and takes acks, the newest snapshot and the consumer's run id (a
  new run id = the consumer restarted: register again, re-send unacked), every period the
  consumer last sent (`Status.heartbeat_s`: longer with more producers, common/net/heartbeat.py),
  and at once when the engine first holds this run's weights (a learner may wait for that) or
  the connection was made anew (a restarted consumer hears of us without waiting a period);
- `announce`: listens for new snapshots (producer/announcements.py);
- `weights`: loads the newest announced snapshot, from the consumer's file on this host or over
  the network (producer/weights.py);
- `release`: sends the held groups the consumer has made room for, the moment it says so
  (a status it pushes unasked; producer/outbox.py);
- `leases`: keeps up to `max_in_flight` leases, each run by a `lease-<id>` task
  (producer/lease_task.py; a finished group the consumer told it to hold keeps its lease's slot
  until sent: backpressure). A request
  that cannot be granted waits at the consumer until leases free up (`net.lease_wait_s`; in a
  crowd, several heartbeat periods: common/net/heartbeat.py); after an empty reply the producer
  pauses (`producer/backoff.py`) before asking again, sooner when a newer snapshot is announced.
  So a starved producer sends one request per wait, not one per round trip.
A consumer silent for `net.consumer_timeout_s` (or three heartbeat periods, if longer:
common/net/heartbeat.py) raises `ConsumerLost` from the heartbeat (exit 3 in producer/main.py).
Unacked groups are re-sent after `net.resend_after_s`, stretched alike (acks ride every reply).

Invariants: a lease starts generating only once the loaded weights are at least its
`min_version` (the staleness bound by construction) and come from the consumer's current run;
an eval lease is sampled with exactly the version it names, or given back unsampled, and an
eval round's version is held until the round is leased (producer/pins.py);
every finished group stays in the outbox until acknowledged; a reward that raises or hangs
scores 0 and is counted (producer/rewards/); a snapshot that fails
verification is never loaded, and one that can never fit the model ends the producer with one
clear error (producer/weights.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from functools import partial

import zmq
import zmq.asyncio

from common import wire
from common.config import Config
from common.config.evaluation import eval_slots
from common.errors import ConfigError
from common.host.core_board import Seat
from common.net.heartbeat import GOODBYE_WAIT_S, lease_wait_s, silence_limit_s
from common.net.keys import load_keys
from common.net.sockets import client_socket, endpoint_with_port
from producer import core_share
from producer.announcements import announcements
from producer.backoff import Backoff
from producer.base_model import fetch_model
from producer.control import ControlClient, Rejected, waits_line
from producer.endpoint_file import NoConsumer
from producer.fetch.relay import Relay
from producer.lease_task import LeaseRunner
from producer.outbox import Outbox
from producer.pins import eval_room, pin_lease, round_pin
from producer.session import EngineKey, KeptEngine, Session, open_session
from producer.stall import Stall
from producer.state import State
from producer.weights import Weights

log = logging.getLogger("asyncgrpo.producer")
_REQUEST_TIMEOUT_S = 10.0
_BACKOFF_FIRST_S, _BACKOFF_CAP_S = 0.05, 1.0  # pauses between lease requests that got nothing


class ConsumerLost(Exception):
    """The consumer has not answered for `net.consumer_timeout_s`."""


class Producer:
    """One producer process's state and tasks. `session` is None until `prepare` returns (the
    heartbeat runs meanwhile and reports "starting"); the tasks that need it are given it."""

    def __init__(
        self, cfg: Config, ctx: zmq.asyncio.Context, *, kept: KeptEngine | None = None
    ) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.kept = kept  # a previous run's engine (producer.follow), reused if it fits
        self.engine_key: EngineKey | None = None  # (model dir, vocab size) of the engine
        pid = os.getpid()
        self.state = State(cfg.producer.id or f"{socket.gethostname()}-{pid}")
        self.keys = load_keys(cfg.net.keys_dir, "client") if cfg.net.keys_dir else None
        self.max_bytes = int(cfg.net.max_message_mib * (1 << 20))
        self.control = ControlClient(
            ctx,
            cfg.net.connect,
            keys=self.keys,
            max_message_bytes=self.max_bytes,
            max_in_flight=2 * cfg.producer.max_in_flight,  # eval leases come on top
        )
        self.control.on_pushed = self._on_pushed
        self.control.on_connected = self.state.changed.bump  # the heartbeat beats at once
        self.state.heartbeat_s = cfg.net.heartbeat_s  # until the consumer says otherwise
        self.session: Session | None = None
        self.relay = (
            Relay(
                ctx,
                host=cfg.producer.relay_host,
                port=cfg.producer.relay_port,
                keys=self.keys,
                insecure=cfg.net.insecure,
                max_message_bytes=self.max_bytes,
            )
            if cfg.producer.relay_host
            else None
        )
        self.weights = Weights(
            cfg,
            self.state,
            self.control,
            ctx,
            keys=self.keys,
            max_message_bytes=self.max_bytes,
            relay=self.relay,
            timeout_s=_REQUEST_TIMEOUT_S,
            report=self.request_status,
        )
        self.rng = random.Random(cfg.run.seed ^ pid)
        self.started = time.monotonic()
        p = cfg.producer
        self.stall = Stall(
            after_s=p.stall_after_s, stall_s=p.stall_s, started=self.started, count=self.state.count
        )
        self.leases = LeaseRunner(
            self.state, run_seed=cfg.run.seed, stall=self.stall, started=self.started
        )
        self._registering = asyncio.Lock()
        self.cores: Seat | None = None  # on this host's core board (hf engine on a CPU)

    # -- setup ---------------------------------------------------------------------------------
    async def register(self) -> wire.Welcome:
        s = self.session
        held = tuple(self.state.in_flight | set(s.outbox.pending if s else ()))
        msg = wire.Register(
            req=0,
            producer_id=self.state.producer_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            engine=self.cfg.producer.engine,
            loaded_version=s.engine.version if s else -1,
            held_leases=held,
        )
        net, follow = self.cfg.net, self.cfg.producer.follow
        wait_s = (net.consumer_timeout_s or float("inf")) if follow else net.handshake_timeout_s
        started = time.monotonic()
        deadline, said = started + wait_s, started
        while True:
            try:
                reply = await self.control.request(msg, timeout_s=min(_REQUEST_TIMEOUT_S, 2.0))
            except TimeoutError:
                if time.monotonic() >= said:
                    log.info(
                        "waiting for the consumer at %s (%s; %.0f s so far, %s)",
                        self.cfg.net.connect,
                        self.control.link,
                        time.monotonic() - started,
                        waits_line(follow, wait_s),
                    )
                    said = time.monotonic() + 10.0
                if time.monotonic() > deadline:
                    key = "net.consumer_timeout_s" if follow else "net.handshake_timeout_s"
                    # a handshake that keeps failing is this side's keys or the consumer's: no
                    # restart fixes it (exit 2); silence may be a consumer still starting (3)
                    mismatch = self.control.handshake_failed
                    raise (ConfigError if mismatch else NoConsumer)(
                        f"no answer from the consumer at net.connect = {net.connect!r} "
                        f"within {key} = {wait_s:g} s ({self.control.link}; "
                        "is it running, and are the address and keys right?)"
                    ) from None
                continue
            except Rejected as exc:
                if exc.reason != "wrong_key":
                    raise
                raise ConfigError(
                    f"the consumer refused producer id {self.state.producer_id!r}: another "
                    "producer (another CurveZMQ key) holds it; choose another --id "
                    "(producer.id), or wait until that producer is gone"
                ) from None
            assert isinstance(reply, wire.Welcome), reply
            if follow and reply.status.finished and not self.state.run_id:
                # the previous run's consumer, still telling producers it is over: wait for
                # the next one at this address
                await asyncio.sleep(net.heartbeat_s)
                continue
            self._on_status(reply.status)
            # the consumer's data socket (snapshot chunks); a restarted consumer may move it
            data_endpoint = endpoint_with_port(net.connect, reply.spec.data_port)
            self.weights.fetcher.data_endpoint = data_endpoint
            return reply

    async def setup(self) -> wire.RunSpec:
        """Register; the heartbeat may start right after this (engine loading can take long)."""
        welcome = await self.register()
        log.info(
            "registered as %s with consumer run %s", self.state.producer_id, welcome.status.run_id
        )
        return welcome.spec

    async def prepare(self, spec: wire.RunSpec) -> Session:
        """Tokenizer, engine, rewards and the outbox, from the run spec (producer/session.py);
        kept as `session`. A previous run's engine is taken (reused or closed) here."""
        kept, self.kept = self.kept, None
        self.session, self.engine_key = await open_session(
            self.cfg,
            spec,
            kept=kept,
            rng=self.rng,
            push=lambda: self._socket(zmq.PUSH, spec.rollouts_port),
            fetch=lambda files: fetch_model(
                self.ctx,
                files,
                data_endpoint=self.weights.fetcher.data_endpoint,
                keys=self.keys,
                max_message_bytes=self.max_bytes,
            ),
        )
        self.cores = core_share.rejoin(self.cores, self.cfg, self.state, self.session.engine)
        limit = self.cfg.producer.max_in_flight  # grants of eval leases beside them decode
        slots = eval_slots(limit, spec.group_size, spec.eval_samples)
        self.control.limits = wire.reply_limits(self.max_bytes, limit + slots)
        return self.session

    def _socket(self, kind: int, port: int) -> zmq.asyncio.Socket:
        endpoint = endpoint_with_port(self.cfg.net.connect, port)
        return client_socket(
            self.ctx, kind, endpoint, keys=self.keys, max_message_bytes=self.max_bytes
        )

    # -- status handling -----------------------------------------------------------------------
    def _on_status(self, status: wire.Status) -> bool:
        """Apply a status; True when the consumer restarted (new run id)."""
        restarted = bool(self.state.run_id) and status.run_id != self.state.run_id
        self.state.run_id = status.run_id
        self.state.heartbeat_s = status.heartbeat_s
        if self.session is not None:
            self.session.outbox.acknowledge(status.acks)
            self.session.outbox.resend_after_s = silence_limit_s(
                self.cfg.net.resend_after_s, status.heartbeat_s
            )
        if restarted:
            # A resumed consumer may stand at an older version than the weights we hold (it
            # restarts from its last checkpoint): forget the old run's snapshots, even when
            # the new one has published none yet, so that its lower versions are taken.
            self.state.target = status.snapshot
        elif status.snapshot is not None and (
            self.state.target is None or status.snapshot.version > self.state.target.version
        ):
            self.state.target = status.snapshot
        self.state.finished = status.finished
        self.state.eval_round, self.state.eval_from = status.eval_version, status.eval_from
        self._round_pin()
        self.state.changed.bump()
        return restarted

    async def request_status(
        self, msg: wire.Message, timeout_s: float = _REQUEST_TIMEOUT_S
    ) -> wire.Message | None:
        """Send `msg` and apply the status of its reply (`_on_status`): the one path of every
        request answered with a status (heartbeats, lease requests, fetch reports), since the
        consumer hands acks and the end of the run over in it once. None when it timed out
        (counted) or the consumer had forgotten us (registered again)."""
        try:
            reply = await self.control.request(msg, timeout_s=timeout_s)
        except TimeoutError:
            self.state.count("control_timeouts")
            return None
        except Rejected as exc:
            if exc.reason != "not_registered":
                raise
            await self._reregister()
            return None
        if self._on_status(reply.status):  # type: ignore[union-attr]
            await self._reregister()
        return reply

    def _on_pushed(self, status: wire.Status) -> None:
        """A status the consumer sent unasked (room for groups it told us to hold): applied
        unless it comes from another consumer run (the next reply handles a restart)."""
        if status.run_id == self.state.run_id:
            self._on_status(status)

    async def _reregister(self) -> None:
        if self._registering.locked():  # another task is already at it
            async with self._registering:
                return
        async with self._registering:
            log.warning(
                "consumer restarted or forgot us: registering again, re-sending unacked groups"
            )
            await self.register()
            if self.session is not None:
                resent = await self.session.outbox.resend(everything=True)
                self.state.count("groups_resent", resent)

    # -- tasks ---------------------------------------------------------------------------------
    def check_consumer(self) -> None:
        """Raise `ConsumerLost` once the consumer has been silent for net.consumer_timeout_s,
        or three of the heartbeat periods it sent when that is longer."""
        timeout = self.cfg.net.consumer_timeout_s
        silent = time.monotonic() - self.control.last_reply_s
        if timeout and silent > silence_limit_s(timeout, self.state.heartbeat_s):
            unacked = len(self.session.outbox.pending) if self.session is not None else 0
            raise ConsumerLost(
                f"no answer from the consumer at {self.cfg.net.connect} for {silent:.0f} s "
                f"(net.consumer_timeout_s = {timeout:g}): it has stopped or cannot be reached; "
                f"exiting ({unacked} finished groups were never acknowledged)"
            )

    async def heartbeat_loop(self) -> None:
        beat = self.cfg.net.heartbeat_s
        state, control = self.state, self.control
        while True:
            self.check_consumer()
            version = self.session.engine.version if self.session is not None else -1
            msg = wire.Heartbeat(
                req=0,
                producer_id=self.state.producer_id,
                loaded_version=version,
                state=self._state_name(),
                num_in_flight=len(self.state.in_flight),
                counters=self._counters(),
            )
            # a short timeout: after a consumer restart, the request the old one never answered
            # must not delay registering with the new one (which may be about to stop)
            await self.request_status(msg, timeout_s=min(max(5 * beat, 2.0), _REQUEST_TIMEOUT_S))
            if self.session is not None:
                self.state.count("groups_resent", await self.session.outbox.resend())
            due = partial(self._beat_due, self._holds_run_weights(), control.connects)
            await state.changed.wait_for(due, state.heartbeat_s)

    def _holds_run_weights(self) -> bool:
        """The engine holds a snapshot of the consumer's current run (what makes it ready)."""
        return self.session is not None and self.state.weights_run == self.state.run_id

    def _beat_due(self, ready: bool, connects: int) -> bool:
        """Beat before the period is over: the engine came to hold this run's weights (or lost
        them), or the connection to the consumer was made anew since (`ready`, `connects`)."""
        return self._holds_run_weights() != ready or self.control.connects != connects

    async def release_loop(self, outbox: Outbox) -> None:
        """Send the held groups the consumer has room for as soon as it says so."""
        while True:
            await self.state.changed.wait_for(lambda: outbox.num_released > 0, 60.0)
            if outbox.num_released:
                self.state.count("groups_resent", await outbox.resend())

    async def announce_loop(self, spec: wire.RunSpec) -> None:
        sub = self._socket(zmq.SUB, spec.announce_port)
        try:
            async for ann in announcements(sub, wire.Limits(max_message_bytes=1 << 20)):
                if ann.run_id == self.state.run_id and (
                    self.state.target is None or ann.snapshot.version > self.state.target.version
                ):
                    self.state.target = ann.snapshot
                    self.state.changed.bump()
        finally:
            sub.close(linger=0)

    async def lease_loop(self, tg: asyncio.TaskGroup, session: Session) -> None:
        limit = self.cfg.producer.max_in_flight
        slots = eval_slots(limit, session.spec.group_size, session.spec.eval_samples)
        state = self.state
        backoff = Backoff(_BACKOFF_FIRST_S, _BACKOFF_CAP_S, self.rng)

        def free() -> int:  # a group the consumer told us to hold takes its lease's slot
            return limit - len(state.in_flight) - session.outbox.num_held

        def may_ask() -> bool:
            room = free() > 0 or eval_room(state, slots) > 0
            return state.finished or (room and state.target is not None)

        while not state.finished:
            self._round_pin()
            if not may_ask():  # every slot taken, or no snapshot announced yet
                await state.changed.wait_for(may_ask, 1.0)
                continue
            declined, state.declined = tuple(state.declined), []
            floor_s = session.spec.heartbeat_s
            wait_s = lease_wait_s(state.heartbeat_s, floor_s=floor_s)  # 0: net.lease_wait_s
            msg = wire.LeaseRequest(
                req=0,
                producer_id=state.producer_id,
                max_leases=max(free(), 0),
                loaded_version=session.engine.version,
                declined=declined,
                max_eval_leases=eval_room(state, slots),
                wait_s=wait_s,
            )
            asked = time.monotonic()
            reply = await self.request_status(msg, timeout_s=wait_s + _REQUEST_TIMEOUT_S)
            leases = reply.leases if isinstance(reply, wire.LeaseGrant) else ()
            for lease in leases:
                if lease.eval_version >= 0 and not pin_lease(state, session.engine.version, lease):
                    continue
                state.in_flight.add(lease.lease_id)
                self.leases.tasks[lease.lease_id] = tg.create_task(
                    self.leases.run(session, lease), name=f"lease-{lease.lease_id}"
                )
            if leases:
                backoff.reset()
                continue
            state.count("lease_requests_empty")
            # Nothing was free while it waited. Pause, less when a newer snapshot comes (leases
            # follow it: the condition, not any change, since the reply bumped the counter);
            # a crowd answered at once (net.lease_wait_s = 0) paces by the period, uncut
            at_once = time.monotonic() - asked < wait_s / 2
            crowded = backoff.follow(state.heartbeat_s if at_once else floor_s, floor_s=floor_s)
            shown = state.target.version if state.target is not None else -1
            until = partial(self._newer_than, float("inf") if crowded else shown)
            await state.changed.wait_for(until, backoff.next_s())
        log.info("the consumer needs no more groups: producer done")
        for task in self.leases.tasks.values():  # their groups would never be trained
            task.cancel()

    def _round_pin(self) -> None:
        round_pin(self.state, self.session.engine.version if self.session is not None else None)

    def _newer_than(self, version: float) -> bool:
        """The run is finished, or a snapshot newer than `version` has been announced."""
        target = self.state.target
        return self.state.finished or (target is not None and target.version > version)

    # -- reporting -----------------------------------------------------------------------------
    def _state_name(self) -> str:
        if self.session is None:
            return "starting"
        target, current = self.state.target, self.state.weights_run == self.state.run_id
        if current and self.state.pins and not self.state.loading:
            return "evaluating"  # holding its version for an eval round (producer/pins.py)
        if not current or (target is not None and target.version != self.session.engine.version):
            return "loading"  # or waiting for this consumer's first snapshot
        return "generating" if self.state.in_flight else "idle"

    def _counters(self) -> dict[str, float]:
        self.leases.busy(0)  # account the interval in progress
        out = dict(self.state.counters)
        if self.session is not None:
            outbox = self.session.outbox
            out["unacked"] = len(outbox.pending)
            out["held"] = outbox.num_held
            out["told_hold"], out["hold_s"] = outbox.num_told_hold, outbox.hold_s
            out.update({f"acked_{k}": v for k, v in outbox.outcomes.items()})
            out.update(self.session.rewards.counters)
            if self.session.episodes is not None:
                out.update(self.session.episodes.counters)
        out.update(self.weights.counters)
        out.update(core_share.counters(self.cores, self.session))
        if self.relay is not None:
            out.update(self.relay.counters)
        out["uptime_s"] = time.monotonic() - self.started
        return out

    async def goodbye(self) -> None:
        if self.session is None:
            return
        held = tuple(self.session.outbox.pending)
        with contextlib.suppress(TimeoutError, Rejected, ConfigError):  # KeyRefused is one
            reply = await self.control.request(
                wire.Goodbye(0, self.state.producer_id, held), timeout_s=GOODBYE_WAIT_S
            )
            if isinstance(reply, wire.StatusReply):
                self._on_status(reply.status)

    async def close(self, *, keep_engine: bool = False) -> KeptEngine | None:
        """Close sockets, rewards and (unless kept for a next run) the engine; the kept one."""
        kept = None
        if self.kept is not None:  # a previous run's engine this run never took
            await self.kept[1].close()
            self.kept = None
        if self.session is not None:
            self.session.rewards.close()
            if self.session.episodes is not None:
                self.session.episodes.close()
            core_share.leave(self.cores, self.session.engine)
            self.cores = None
            if keep_engine and self.engine_key is not None:
                kept = (self.engine_key, self.session.engine)
            else:
                await self.session.engine.close()
            self.session.outbox.sock.close(linger=0)
        self.control.close()
        if self.relay is not None:
            self.relay.close()
        self.weights.close()
        return kept
