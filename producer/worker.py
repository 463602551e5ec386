"""The producer process: lease prompts, sample G completions, score, send; reload weights.

`asyncio.run(main(cfg))` registers (`setup`: the run spec), then builds a `Session` (`prepare`:
engine, tokenizer, rewards, outbox; nothing in it is optional) while heartbeats already run, and
runs one `asyncio.TaskGroup` of named tasks; a failing task cancels the group and one `finally`
closes every socket and the engine:
- `replies`: the control socket's reader (producer/control.py);
- `heartbeat`: every `heartbeat_s`, reports state and takes acks, the newest snapshot and the
  consumer's run id (a new run id = the consumer restarted: register again, re-send unacked);
- `announce`: listens for new snapshots; `weights`: fetches (shared filesystem when the file is
  there and its hash matches, else over the network: producer/fetch/fetcher.py, chunks from the
  consumer's data socket or relays),
  verifies and loads the newest one. A file the consumer wrote on this very host is taken on its
  manifest's hash (`producer.trust_local_hash`): the writer hashed the memory it wrote, and one
  page cache serves both processes, so reading and hashing it again would only add latency;
  the engine then reads it straight away, from the producer's own pinned link to the very file
  that was checked (`common.snapshot.pin_local`), never the consumer's path again;
- `release`: sends the held groups the consumer has made room for, the moment it says so
  (a status it pushes unasked; producer/outbox.py);
- `leases`: keeps up to `max_in_flight` leases, each run by a `lease-<id>` task (a finished
  group the consumer told it to hold keeps its lease's slot until sent: backpressure). A request
  that cannot be granted waits at the consumer until leases free up (`net.lease_wait_s`); after
  an empty reply the producer pauses (`producer/backoff.py`: jittered, doubling from 50 ms to
  1 s) before asking again, and sooner when a newer snapshot is announced, so a starved
  producer sends about one request per `net.lease_wait_s`, not one per round trip.

Ending: the consumer says `finished` in its replies (the run is over: exit 0; with
`producer.follow`, wait for the next consumer at the same address instead, up to
`net.consumer_timeout_s`, skipping a consumer that is still saying its run is finished, and serve
that run with a fresh session: the engine is kept when the model is the same, and weights are
taken only from the new run's snapshots), or a signal arrives (goodbye, exit 0), or the
consumer has not answered for `net.consumer_timeout_s`: then `ConsumerLost` ends the producer
with one clear line and exit code 3, whatever it was doing, so no producer outlives its consumer
for long (a consumer that restarts with `--resume` within that time is rejoined).

Invariants: a lease starts generating only once the loaded weights are at least its
`min_version` (the staleness bound by construction); every finished group stays in the outbox
until acknowledged; a reward that raises or hangs scores 0 and is counted (producer/rewards.py);
a snapshot that fails verification is never loaded (the producer keeps its weights and says so);
a verified snapshot that does not fit the model (names, shapes) ends the producer with one clear
error (exit 2): that cannot get better by retrying.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zmq
import zmq.asyncio

from common import snapshot as snap
from common import wire
from common.config import Config
from common.errors import ConfigError, SnapshotError, SnapshotMismatch
from common.keys import load_keys
from common.sockets import client_socket, endpoint_with_port
from producer.announcements import announcements
from producer.backoff import Backoff
from producer.control import ControlClient, KeyRefused, Rejected
from producer.endpoint_file import resolve_connect
from producer.engines import make_engine
from producer.engines.base import Engine, SamplingParams
from producer.fetch.fetcher import Fetcher, Held
from producer.fetch.relay import Relay
from producer.outbox import Outbox
from producer.scoring import Rewards, make_rewards
from producer.tokenizer import PromptCodec

log = logging.getLogger("asyncgrpo.producer")
EXIT_CONSUMER_LOST = 3
_REQUEST_TIMEOUT_S = 10.0
_BACKOFF_FIRST_S, _BACKOFF_CAP_S = 0.05, 1.0  # pauses between lease requests that got nothing


def lease_seed(run_seed: int, lease_id: int) -> int:
    """The sampling seed of a lease: whichever producer takes it, the same lease of the same run
    samples the same completions from the same weights (what makes a synchronous run, and the
    prompts and seeds of an asynchronous one, repeatable)."""
    return int(np.random.SeedSequence([run_seed, lease_id]).generate_state(1)[0]) & ((1 << 30) - 1)


KeptEngine = tuple[tuple[str, int], Engine]  # ((model dir, vocab size), engine) between runs


class NoConsumer(ConfigError):
    """No consumer answered the handshake in time."""


class ConsumerLost(Exception):
    """The consumer has not answered for `net.consumer_timeout_s`."""


class Changes:
    """A change counter that coroutines can wait on without missing a change (no clear races)."""

    def __init__(self) -> None:
        self.count = 0
        self._event = asyncio.Event()

    def bump(self) -> None:
        self.count += 1
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seen: int, timeout_s: float) -> None:
        """Return once `count != seen`, or after `timeout_s`."""
        if self.count != seen:
            return
        try:
            async with asyncio.timeout(timeout_s):  # unlike wait_for, never swallows a cancel
                await self._event.wait()
        except TimeoutError:
            pass

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Return once `predicate()` holds (checked at each change), or after `timeout_s`.
        Unlike `wait`, changes that leave it false do not end the wait."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await self.wait(self.count, left)


@dataclass
class State:
    producer_id: str
    run_id: str = ""
    target: wire.SnapshotInfo | None = None  # newest snapshot the consumer has announced
    weights_run: str = ""  # run id of the consumer whose snapshot the engine holds
    finished: bool = False
    in_flight: set[int] = field(default_factory=set)
    counters: dict[str, float] = field(default_factory=dict)
    changed: Changes = field(default_factory=Changes)  # version, acks, target or in-flight moved

    def count(self, key: str, n: float = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n


@dataclass(frozen=True, slots=True, eq=False)
class Session:
    """What a producer works with once registered and prepared (`Producer.prepare`)."""

    spec: wire.RunSpec  # the consumer's run: G, sampling, rewards, ports
    engine: Engine
    codec: PromptCodec
    rewards: Rewards  # the run's reward functions, or the fake engine's coins
    outbox: Outbox  # every finished group until it is acknowledged


class Producer:
    """One producer process's state and tasks. `session` is None until `prepare` returns (the
    heartbeat runs meanwhile and reports "starting"); the tasks that need it are given it."""

    def __init__(
        self, cfg: Config, ctx: zmq.asyncio.Context, *, kept: KeptEngine | None = None
    ) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.kept = kept  # a previous run's engine (producer.follow), reused if it fits
        self.engine_key: tuple[str, int] | None = None  # (model dir, vocab size) of the engine
        pid = os.getpid()
        self.state = State(cfg.producer.id or f"{socket.gethostname()}-{pid}")
        self.keys = load_keys(cfg.net.keys_dir, "client") if cfg.net.keys_dir else None
        self.max_bytes = int(cfg.net.max_message_mib * (1 << 20))
        self.control = ControlClient(
            ctx, cfg.net.connect, keys=self.keys, max_message_bytes=self.max_bytes
        )
        self.control.on_pushed = self._on_pushed
        self.session: Session | None = None
        self.cache = Path(tempfile.mkdtemp(prefix="asyncgrpo-snapshots-"))
        self.relay = (
            Relay(
                ctx, host=cfg.producer.relay_host, port=cfg.producer.relay_port, keys=self.keys,
                insecure=cfg.net.insecure, max_message_bytes=self.max_bytes,
            )
            if cfg.producer.relay_host
            else None
        )  # fmt: skip
        self.fetcher = Fetcher(
            self.control, ctx, data_endpoint="", producer_id=self.state.producer_id, keys=self.keys,
            max_message_bytes=self.max_bytes, relay=self.relay, timeout_s=_REQUEST_TIMEOUT_S,
        )  # fmt: skip
        self.held: Held | None = None  # the newest snapshot file fetched and verified here
        self.rng = random.Random(cfg.run.seed ^ pid)
        self.started = time.monotonic()
        self.lease_tasks: dict[int, asyncio.Task[None]] = {}
        self._registering = asyncio.Lock()
        self.num_active, self.busy_since = 0, self.started

    # -- setup ---------------------------------------------------------------------------------
    async def register(self) -> wire.Welcome:
        s = self.session
        held = tuple(self.state.in_flight | set(s.outbox.pending if s else ()))
        msg = wire.Register(
            0, self.state.producer_id, socket.gethostname(), os.getpid(), self.cfg.producer.engine,
            s.engine.version if s else -1, held,
        )  # fmt: skip
        net, follow = self.cfg.net, self.cfg.producer.follow
        wait_s = (net.consumer_timeout_s or float("inf")) if follow else net.handshake_timeout_s
        deadline = time.monotonic() + wait_s
        said = time.monotonic()
        while True:
            try:
                reply = await self.control.request(msg, timeout_s=min(_REQUEST_TIMEOUT_S, 2.0))
            except TimeoutError:
                if time.monotonic() >= said:
                    log.info("waiting for the consumer at %s (%s)", self.cfg.net.connect,
                             self.control.link)  # fmt: skip
                    said = time.monotonic() + 10.0
                if time.monotonic() > deadline:
                    key = "net.consumer_timeout_s" if follow else "net.handshake_timeout_s"
                    raise NoConsumer(
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
            self.fetcher.data_endpoint = endpoint_with_port(net.connect, reply.spec.data_port)
            return reply

    async def setup(self) -> wire.RunSpec:
        """Register; the heartbeat may start right after this (engine loading can take long)."""
        welcome = await self.register()
        log.info(
            "registered as %s with consumer run %s", self.state.producer_id, welcome.status.run_id
        )
        return welcome.spec

    async def prepare(self, spec: wire.RunSpec) -> Session:
        """Tokenizer, engine, rewards and the outbox, from the run spec; kept as `session`."""
        ours = bool(self.cfg.producer.model)
        model_dir = (
            Path(self.cfg.producer.model or spec.model)
            if self.cfg.producer.engine != "fake"
            else None
        )
        whose = (
            "this producer's producer.model (--model)"
            if ours
            else "the consumer's model.path, announced to producers"
        )
        if model_dir is not None and not (model_dir / "config.json").exists():
            raise ConfigError(
                f"model directory {str(model_dir)!r} ({whose}) is not a Hugging Face model "
                "directory on this producer's host: pass --model with a local copy of the "
                "learner's model (--model demo when the consumer trains the embedded demo)"
            )
        self.engine_key = (str(model_dir), spec.vocab_size)
        engine: Engine | None = None
        if self.kept is not None:  # the previous run's engine (producer.follow)
            key, engine = self.kept
            self.kept = None
            if key != self.engine_key:
                await engine.close()
                engine = None
        try:
            codec = PromptCodec(model_dir, spec.prompt_format, vocab_size=spec.vocab_size)
            if engine is None:
                engine = await asyncio.to_thread(
                    make_engine,
                    self.cfg,
                    model_dir=model_dir,
                    vocab_size=spec.vocab_size,
                    seed=self.rng.randrange(1 << 30),
                )
        except (OSError, ValueError, RuntimeError, ImportError) as exc:  # a model that won't load
            raise ConfigError(
                f"cannot load the model {str(model_dir)!r} ({whose}) on this producer's host: "
                f"{type(exc).__name__}: {_first_line(exc)}"
            ) from exc
        rewards = make_rewards(self.cfg, spec, codec)
        push = self._socket(zmq.PUSH, spec.rollouts_port)
        outbox = Outbox(push, resend_after_s=self.cfg.net.resend_after_s)
        self.session = Session(spec, engine, codec, rewards, outbox)
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
        if self.session is not None:
            self.session.outbox.acknowledge(status.acks)
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
        self.state.changed.bump()
        return restarted

    async def _request_status(
        self, msg: wire.Message, timeout_s: float = _REQUEST_TIMEOUT_S
    ) -> wire.Message | None:
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
        """Raise `ConsumerLost` once the consumer has been silent for net.consumer_timeout_s."""
        timeout = self.cfg.net.consumer_timeout_s
        silent = time.monotonic() - self.control.last_reply_s
        if timeout and silent > timeout:
            unacked = len(self.session.outbox.pending) if self.session is not None else 0
            raise ConsumerLost(
                f"no answer from the consumer at {self.cfg.net.connect} for {silent:.0f} s "
                f"(net.consumer_timeout_s = {timeout:g}): it has stopped or cannot be reached; "
                f"exiting ({unacked} finished groups were never acknowledged)"
            )

    async def heartbeat_loop(self) -> None:
        beat = self.cfg.net.heartbeat_s
        while True:
            self.check_consumer()
            version = self.session.engine.version if self.session is not None else -1
            msg = wire.Heartbeat(
                0, self.state.producer_id, version, self._state_name(),
                len(self.state.in_flight), self._counters(),
            )  # fmt: skip
            # a short timeout: after a consumer restart, the request the old one never answered
            # must not delay registering with the new one (which may be about to stop)
            await self._request_status(msg, timeout_s=min(max(5 * beat, 2.0), _REQUEST_TIMEOUT_S))
            if self.session is not None:
                self.state.count("groups_resent", await self.session.outbox.resend())
            await asyncio.sleep(beat)

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

    async def weights_loop(self, engine: Engine) -> None:
        while True:
            seen = self.state.changed.count
            target, run = self.state.target, self.state.run_id
            if target is None or (
                target.version == engine.version and self.state.weights_run == run
            ):
                await self.state.changed.wait(seen, 5.0)
                continue
            try:
                directory = await self._fetch(target)
                t0 = time.perf_counter()
                await engine.load_weights(directory, target.version)
                self.state.weights_run = run
                self.state.count("reloads")
                self.state.count("reload_s", time.perf_counter() - t0)
                log.info("loaded weights v%d", target.version)
                self.state.changed.bump()
            except SnapshotMismatch as exc:  # the model is wrong: retrying can never help
                raise ConfigError(
                    f"the learner's weights can never load into this producer's model ({exc}): "
                    + self._whose_model()
                ) from exc
            except (SnapshotError, Rejected, TimeoutError) as exc:
                if self.state.target is not target:
                    # A newer snapshot was announced meanwhile; the consumer keeps only the last
                    # few, so this one may simply have been rotated away. Go to the newer one.
                    self.state.count("snapshots_superseded")
                    log.info("snapshot v%d superseded before it was loaded", target.version)
                    continue
                self.state.count("snapshot_failures")
                log.warning(
                    "snapshot v%d not loaded (%s); keeping v%d",
                    target.version,
                    exc,
                    engine.version,
                )
                # Back off, but take a newer announcement at once.
                deadline = time.monotonic() + 1.0
                while self.state.target is target and (left := deadline - time.monotonic()) > 0:
                    await self.state.changed.wait(self.state.changed.count, left)

    async def lease_loop(self, tg: asyncio.TaskGroup, session: Session) -> None:
        limit = self.cfg.producer.max_in_flight
        state = self.state
        backoff = Backoff(_BACKOFF_FIRST_S, _BACKOFF_CAP_S, self.rng)

        def free() -> int:  # a group the consumer told us to hold takes its lease's slot
            return limit - len(state.in_flight) - session.outbox.num_held

        def may_ask() -> bool:
            return state.finished or (free() > 0 and state.target is not None)

        while not state.finished:
            if not may_ask():  # every slot taken, or no snapshot announced yet
                await state.changed.wait_for(may_ask, 1.0)
                continue
            msg = wire.LeaseRequest(0, state.producer_id, free(), session.engine.version)
            reply = await self._request_status(msg)
            leases = reply.leases if isinstance(reply, wire.LeaseGrant) else ()
            for lease in leases:
                state.in_flight.add(lease.lease_id)
                self.lease_tasks[lease.lease_id] = tg.create_task(
                    self.run_lease(session, lease), name=f"lease-{lease.lease_id}"
                )
            if leases:
                backoff.reset()
                continue
            state.count("lease_requests_empty")
            # Nothing was free for net.lease_wait_s. Pause before asking again, less when a
            # newer snapshot comes (leases follow it). The condition, not any change: the
            # reply itself has just bumped the change counter.
            shown = state.target.version if state.target is not None else -1
            await state.changed.wait_for(lambda v=shown: self._newer_than(v), backoff.next_s())
        log.info("the consumer needs no more groups: producer done")
        for task in self.lease_tasks.values():  # their groups would never be trained
            task.cancel()

    def _newer_than(self, version: int) -> bool:
        """The run is finished, or a snapshot newer than `version` has been announced."""
        target = self.state.target
        return self.state.finished or (target is not None and target.version > version)

    async def run_lease(self, session: Session, lease: wire.Lease) -> None:
        spec, engine, codec = session.spec, session.engine, session.codec
        busy = False
        try:
            t0 = time.perf_counter()
            # The staleness bound, by construction; and never weights of a consumer incarnation
            # that has been replaced (a resume may have rolled the versions back).
            while engine.version < lease.min_version or self.state.weights_run != self.state.run_id:
                await self.state.changed.wait(self.state.changed.count, 1.0)
            await self._maybe_stall()
            self._busy(+1)
            busy = True
            prompt_ids = codec.encode(lease.prompt)
            params = SamplingParams(
                n=spec.group_size, temperature=spec.temperature, max_new_tokens=spec.max_new_tokens,
                seed=lease_seed(self.cfg.run.seed, lease.lease_id),
                stop_token_ids=codec.stop_ids,
            )  # fmt: skip
            completions = await engine.generate(prompt_ids, params)
            scored = await session.rewards.score_group(lease, completions)
            versions = np.concatenate([c.versions for c in completions]).astype(np.int32)
            behavior = int(versions.min())
            group = wire.Group(
                lease_id=lease.lease_id,
                producer_id=self.state.producer_id,
                prompt_index=lease.prompt_index,
                behavior_version=behavior,
                prompt_ids=np.asarray(prompt_ids, np.int32),
                completion_ids=np.concatenate([c.token_ids for c in completions]),
                completion_lens=np.array([len(c.token_ids) for c in completions], np.int32),
                behavior_logp=np.concatenate([c.logprobs for c in completions]),
                token_versions=versions if (versions != behavior).any() else np.zeros(0, np.int32),
                rewards=scored.rewards,
                finish_reasons=tuple(c.finish_reason for c in completions),
                temperature=spec.temperature,
                num_reward_errors=scored.num_errors + scored.num_timeouts,
                gen_s=time.perf_counter() - t0,
            )
            await session.outbox.send(group)
            self.state.count("groups_sent")
            self.state.count("tokens_generated", group.num_tokens)
            self.state.count("generate_s", group.gen_s)
        finally:
            if busy:
                self._busy(-1)
            self.lease_tasks.pop(lease.lease_id, None)
            self.state.in_flight.discard(lease.lease_id)
            self.state.changed.bump()

    def _whose_model(self) -> str:
        if self.cfg.producer.model:
            return (f"this producer's --model {self.cfg.producer.model!r} must be a copy of "
                    "the learner's model (same architecture and tokenizer)")  # fmt: skip
        return ("the model the consumer announced differs on this host: pass --model with a "
                "copy of the learner's model")  # fmt: skip

    def _busy(self, delta: int) -> None:
        """Track time with at least one lease generating or scoring (counter busy_s)."""
        now = time.monotonic()
        if self.num_active > 0:
            self.state.count("busy_s", now - self.busy_since)
        self.busy_since = now
        self.num_active += delta

    async def _maybe_stall(self) -> None:
        p = self.cfg.producer
        if p.stall_s > 0 and p.stall_after_s > 0:
            start = self.started + p.stall_after_s
            now = time.monotonic()
            if start <= now < start + p.stall_s:
                self.state.count("stalls")
                await asyncio.sleep(start + p.stall_s - now)

    # -- snapshots -----------------------------------------------------------------------------
    async def _fetch(self, info: wire.SnapshotInfo) -> Path:
        """A private directory holding the verified `model.safetensors` of `info`, which the
        engine then loads: the consumer's own file when this host sees it, pinned so that the
        bytes loaded are the bytes verified (`common.snapshot.pin_local`; taken on its
        manifest when written here, see `producer.trust_local_hash`; else hashed), else
        fetched over the network (producer/fetch/fetcher.py)."""
        t0 = time.perf_counter()
        local = Path(info.path)
        directory = self.cache / f"v{info.version:06d}"
        if await asyncio.to_thread(local.is_file):  # may be a slow shared filesystem
            try:
                _, trusted = await asyncio.to_thread(
                    snap.pin_local,
                    local,
                    directory,
                    expected_hash=info.hash,
                    expected_bytes=info.num_bytes,
                    trust_writer=self.cfg.producer.trust_local_hash,
                )
                self.state.count("snapshots_local_trusted" if trusted else "snapshots_local")
                self.state.count("fetch_s", time.perf_counter() - t0)
                self._prune_cache()
                return directory
            except SnapshotError as exc:
                log.info("shared-filesystem snapshot unusable (%s): fetching over the network", exc)
        directory = self.cache / f"v{info.version:06d}"
        outcome = await self.fetcher.fetch(info, directory, held=self.held)
        self.held = Held(info.version, directory / snap.WEIGHTS_FILE, info.hash)
        self.state.count("snapshots_fetched")
        self.state.count(f"snapshots_fetched_{outcome.file}")
        self.state.count("fetch_bytes", outcome.num_bytes)
        self.state.count("fetch_s", time.perf_counter() - t0)
        log.info("snapshot v%d fetched over the network (%d bytes in %.2f s), BLAKE3 hash verified",
                 info.version, info.num_bytes, time.perf_counter() - t0)  # fmt: skip
        self._prune_cache()
        return directory

    def _prune_cache(self) -> None:
        """Keep the two newest private snapshot directories (the engine's, and the next)."""
        for old in sorted(self.cache.iterdir())[:-2]:
            shutil.rmtree(old, ignore_errors=True)

    # -- reporting -----------------------------------------------------------------------------
    def _state_name(self) -> str:
        if self.session is None:
            return "starting"
        target = self.state.target
        if self.state.weights_run != self.state.run_id or (
            target is not None and target.version != self.session.engine.version
        ):
            return "loading"  # or waiting for this consumer's first snapshot
        return "generating" if self.state.in_flight else "idle"

    def _counters(self) -> dict[str, float]:
        self._busy(0)  # account the interval in progress
        out = dict(self.state.counters)
        if self.session is not None:
            outbox = self.session.outbox
            out["unacked"] = len(outbox.pending)
            out["held"] = outbox.num_held
            out["told_hold"], out["hold_s"] = outbox.num_told_hold, outbox.hold_s
            out.update({f"acked_{k}": v for k, v in outbox.outcomes.items()})
            out.update(self.session.rewards.counters)
        out.update(self.fetcher.counters)
        if self.relay is not None:
            out.update(self.relay.counters)
        out["uptime_s"] = time.monotonic() - self.started
        return out

    async def goodbye(self) -> None:
        if self.session is None:
            return
        held = tuple(self.session.outbox.pending)
        with contextlib.suppress(TimeoutError, Rejected, KeyRefused):
            await self.control.request(wire.Goodbye(0, self.state.producer_id, held), timeout_s=2.0)

    async def close(self, *, keep_engine: bool = False) -> KeptEngine | None:
        """Close sockets, rewards and (unless kept for a next run) the engine; the kept one."""
        kept = None
        if self.kept is not None:  # a previous run's engine this run never took
            await self.kept[1].close()
            self.kept = None
        if self.session is not None:
            self.session.rewards.close()
            if keep_engine and self.engine_key is not None:
                kept = (self.engine_key, self.session.engine)
            else:
                await self.session.engine.close()
            self.session.outbox.sock.close(linger=0)
        self.control.close()
        if self.relay is not None:
            self.relay.close()
        shutil.rmtree(self.cache, ignore_errors=True)
        return kept


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message (libraries write pages)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _log_tasks() -> None:
    for task in asyncio.all_tasks():
        frames = task.get_stack(limit=8)
        where = " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in reversed(frames))
        log.warning("task %s: %s", task.get_name(), where)


async def main(cfg: Config) -> int:
    """Run one producer until the consumer says it is finished or a signal arrives; with
    `producer.follow`, go on to the next consumer's run at the same address after each."""
    if cfg.producer.engine == "hf":
        import torch

        from producer.engines.hf import import_for

        if cfg.producer.torch_threads:
            torch.set_num_threads(cfg.producer.torch_threads)
        # the model this producer expects to be told (its own, or the run's when local), its
        # modules imported now, while the consumer may still be starting
        expected = Path(cfg.producer.model or cfg.model.path)
        if (expected / "config.json").is_file():
            import_for(expected)
    cfg = await resolve_connect(cfg)
    ctx = zmq.asyncio.Context()
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    assert current is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, current.cancel)
    loop.add_signal_handler(signal.SIGUSR1, _log_tasks)  # `kill -USR1 PID`: where is it waiting?
    kept: KeptEngine | None = None
    served = 0
    try:
        while True:
            producer, kept = Producer(cfg, ctx, kept=kept), None  # the producer owns it now
            try:
                code, kept = await serve_run(producer, current)
            except NoConsumer as exc:
                if not served:
                    raise
                log.info("%s runs served; no next one: %s", served, exc)
                return 0
            served += 1
            if kept is None:
                return code
            log.info(
                "run %s finished: waiting for the next consumer at %s (producer.follow)",
                producer.state.run_id,
                cfg.net.connect,
            )
    finally:
        if kept is not None:
            await kept[1].close()
        ctx.term()


async def run(producer: Producer) -> int:
    """Register, prepare and run `producer`'s tasks until the consumer says it is finished or the
    calling task is cancelled (goodbye, 0); `EXIT_CONSUMER_LOST` when the consumer went silent.
    Closes the producer's sockets, not its context (many producers may share one)."""
    current = asyncio.current_task()
    assert current is not None
    code, _ = await serve_run(producer, current)
    return code


async def serve_run(
    producer: Producer, current: asyncio.Task[int]
) -> tuple[int, KeptEngine | None]:
    """One consumer's run: (exit code, the engine kept for the next run when the run finished
    and `producer.follow` is on)."""
    reader = asyncio.create_task(producer.control.read_replies(), name="replies")
    link = asyncio.create_task(producer.control.watch_link(), name="link")
    code, finished = 0, False
    try:
        spec = await producer.setup()
        async with asyncio.TaskGroup() as tg:
            heartbeat = tg.create_task(producer.heartbeat_loop(), name="heartbeat")
            session = await producer.prepare(spec)
            background = [
                heartbeat,
                tg.create_task(producer.announce_loop(spec), name="announce"),
                tg.create_task(producer.release_loop(session.outbox), name="release"),
                tg.create_task(producer.weights_loop(session.engine), name="weights"),
                *([tg.create_task(producer.relay.serve(), name="relay")] if producer.relay else []),
            ]
            await producer.lease_loop(tg, session)
            finished = True
            for task in background:
                task.cancel()
    except asyncio.CancelledError:
        current.uncancel()
        log.info("stopping: telling the consumer which groups we still hold")
    except BaseExceptionGroup as group:  # a task of the group failed
        lost, other = group.split(ConsumerLost)
        if other is not None:
            refused, rest = other.split(ConfigError)  # e.g. our id taken at re-registration
            if refused is not None and rest is None:
                raise refused.exceptions[0] from None
            raise
        assert lost is not None
        log.error("%s", lost.exceptions[0])
        code = EXIT_CONSUMER_LOST
    finally:
        await producer.goodbye()
        reader.cancel()
        link.cancel()
        kept = await producer.close(keep_engine=finished and producer.cfg.producer.follow)
    return code, kept
