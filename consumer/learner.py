"""The consumer process: wires its rooms (server/, train/, snapshots/) and checkpoints, runs the
step loop, owns shutdown.

Threads: the network thread (consumer/server/) owns every socket and the lease book, and
this thread reaches it only through `Server`'s typed methods; the publisher thread writes snapshots;
the recorder thread writes what this one consumed to RUN/stream/ (consumer/stream/recorder.py);
this (main) thread runs the training loop and never touches a socket. One step (the training
part is consumer/step.py's, which a replay runs too):

    collect P admitted groups (gate: stale → dropped_stale, all-equal rewards →
    dropped_zero_variance, both finalized at once so their lease slots are re-granted)
    → trainer.step → version += 1 → leases finalized as trained → snapshot every publish_every
    → one metrics.jsonl line (aggregates only: each producer's state is in producers.json,
    consumer/server/roster.py) → checkpoint every checkpoint_every steps.

Start: the first snapshot (version 0) is published; with `run.wait_for_producers = N` no lease is
granted, and the clock of `metrics.jsonl` (`time_s`) does not start, until N producers are
registered and hold it (a sweep's settings then start alike, however long engines take to load).

Shutdown (steps reached, SIGINT or SIGTERM): stop granting, publish a final snapshot, save a
checkpoint, end every open lease as expired (its prompt is re-queued in the checkpoint), write
the ledger, check that it balances, then keep answering for a few heartbeats until every producer
has heard that the run is finished (however the shutdown began; a second signal ends that wait
at once), exit 0. A stop request is seen between any two arriving groups, not only between
steps (a run whose every group is dropped never finishes a step), so it ends the run within
one optimizer step, the final snapshot and checkpoint, and at most a few heartbeats. A
producer that never hears it gives up on its own after `net.consumer_timeout_s`
(producer/main.py). So no producer outlives the run for long.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import zmq

from common import config as config_mod
from common import wire
from common.config import Config
from common.config.run import reward_names
from common.errors import EXIT_NO_SIGNAL, ConfigError
from common.files import completions_file as CF
from common.files import run_files as RF
from common.files import run_state as RS
from common.files.disk import disk_fault, stop_line
from common.host.model_dir import local_model_dir
from common.net.endpoints import advertised_host, listening, tcp_endpoint
from common.net.keys import load_keys
from common.weights import snapshot as snap
from consumer import core_share
from consumer.data.prompts import make_source
from consumer.evaluation import await_last_round, evaluate_in_learner
from consumer.key_gate import start_key_gate
from consumer.loggers import make_loggers
from consumer.model_checks import check_chat_template, load_trainer
from consumer.no_signal import watch_signal
from consumer.reward_tally import RewardTally
from consumer.server.server import Server
from consumer.server.wire_terms import run_spec
from consumer.staleness import verdict
from consumer.step import Batch, Steps
from consumer.stream.recorder import resume_position
from consumer.train import checkpoint
from consumer.train.protocol import Trainer

log = logging.getLogger("asyncgrpo.consumer")
# After a stop request, the longest wait for producers of a previous incarnation to hear the end
# (they exit by themselves after net.consumer_timeout_s otherwise): a stop ends any run in a
# bounded time, whatever the groups, the producers and the resume state.
STOP_WAIT_S = 5.0


class Learner:
    def __init__(self, cfg: Config, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.stop_event = threading.Event()
        self.hurry = threading.Event()  # a second signal: skip waiting for producers at the end
        self.stop_asked: float | None = None  # monotonic time the training loop saw a stop request
        self.started = time.monotonic()
        self.model_dir = local_model_dir(cfg.model.path) if not cfg.train.simulate_step_s else None
        prompts = make_source(cfg.task, seed=cfg.run.seed)  # bad data stops us before the model
        check_chat_template(prompts, cfg, self.model_dir)
        # its own thread, started before the model loads: W&B's start (its process's imports,
        # `wandb.init`: 2-3 CPU seconds) overlaps the load instead of the first steps
        self.loggers = make_loggers(cfg, run_dir, self.model_dir)
        if self.model_dir is None:
            from consumer.train.simulated import SimulatedTrainer

            self.trainer: Trainer = SimulatedTrainer(cfg)
        else:  # one device, or this rank's part of a sharded learner (torchrun)
            self.trainer = load_trainer(cfg, self.model_dir)
        version, book_state = 0, None
        if cfg.run.resume:
            version, book_state = checkpoint.load(run_dir, trainer=self.trainer)
            cfg = self.cfg = _reuse_ports(cfg, run_dir)
            # the interrupted timeline's snapshots above the checkpoint were never trained on
            # by this one, and the run has not ended (again) yet
            gone = snap.remove_newer(run_dir / RF.SNAPSHOTS, version)
            if gone:
                log.info("resume: removed snapshots %s of the interrupted run", gone)
            (run_dir / RF.FINAL).unlink(missing_ok=True)
            CF.keep_through(run_dir, version)  # samples of the interrupted timeline go
        self.ctx = zmq.Context()
        keys = load_keys(cfg.net.keys_dir, "server") if cfg.net.keys_dir else None
        auth = self.auth = start_key_gate(self.ctx, keys) if keys else None
        spec = run_spec(cfg, vocab_size=self.trainer.vocab_size, model=str(self.model_dir or ""))
        self.server = Server(
            cfg,
            self.ctx,
            prompts=prompts,
            spec=spec,
            run_dir=run_dir,
            keys=keys,
            policy_version=version,
            book_state=book_state,
            hold_grants=cfg.run.wait_for_producers > 0,
            refused_keys=(lambda: auth.refused) if auth is not None else None,
        )
        self.run_id = self.server.run_id
        self.cores = core_share.join(cfg, self.run_id, self.trainer)  # None: not on this CPU
        if cfg.run.resume:
            checkpoint.record_incarnation(run_dir, self.server.incarnation)
            log.info("resumed at version %d (incarnation %d)", version, self.server.incarnation)
        resume_at = resume_position(book_state.log_sizes) if book_state else None
        self.steps = Steps(
            cfg,
            run_dir,
            self.trainer,
            self.model_dir,
            on_published=self.server.announce_snapshot,
            for_network=True,
            resume_from=resume_at,
            version=version,
        )
        self.reward_names = reward_names([r.fn for r in cfg.rewards.fns])
        self.heldout = evaluate_in_learner(cfg, self.model_dir)
        self.signal = watch_signal(cfg, self.model_dir)
        self.signal_said = 0.0  # when signal.json was last written (monotonic)
        # the first groups of a run, for completions.jsonl before the first step (a resumed run
        # has its own)
        self.first_groups: list[wire.Group] | None = None if version else []
        self.ended = ""  # how the run ended (RS.ENDINGS), once it has
        self.reason = ""  # why it stopped early

    @property
    def version(self) -> int:
        """The policy version: optimizer steps taken."""
        return self.steps.version

    # ------------------------------------------------------------------------------------------
    def run(self) -> int:
        host = advertised_host(self.cfg.net.bind_host, self.cfg.net.advertise_host)
        endpoints = RF.Endpoints(**{k: tcp_endpoint(host, p) for k, p in self.server.ports.items()})
        RF.write_endpoints(self.run_dir, endpoints)  # whole or absent: producers may be waiting
        RS.write_consumer(
            self.run_dir,
            RS.ConsumerProcess(
                host=socket.gethostname(),
                pid=os.getpid(),
                started=time.time(),
                began=psutil.Process().create_time(),
            ),
        )
        self.server.start()
        bound = tcp_endpoint(self.cfg.net.bind_host, self.server.ports["control"])
        said = listening(bound, endpoints.control)
        log.info("consumer %s %s (run dir %s)", self.run_id, said, self.run_dir)
        self.steps.publish(wait=True)
        steps = self.cfg.run.steps or 1 << 62
        fault: OSError | None = None
        try:
            self._wait_for_producers()
            t_start = last = time.perf_counter()
            while self.version < steps and not self.stop_event.is_set():
                got = self._collect()
                if got is None:
                    break
                record = self.steps.train(
                    got, started=t_start, last=last, settle=self._settle, books=self._books
                )
                with core_share.busy(self.cores):
                    record.update(self.heldout(self.version, self.trainer.eval_model))
                if self.version >= steps:  # the last version's round, through the producers
                    await_last_round(self.cfg, self.server, self.steps, self.stop_event)
                record.update(self.server.take_eval(last=self.version >= steps))
                last = time.perf_counter()
                self._write(record, got)
                every = self.cfg.train.checkpoint_every
                if every and self.version % every == 0:
                    self._checkpoint()
        except BaseException as exc:
            fault = self._disk_fault(exc)
            if fault is not None and disk_fault(exc) is None:
                raise fault from exc  # the network thread's: what stopped it, not that it did
            raise
        finally:
            if self.stop_event.is_set():
                self.stop_asked = time.monotonic()
            if not self.ended:
                self.ended = "steps" if self.version >= steps else "stopped"
            if fault is None:
                self.shutdown()
            else:
                self.abandon()
        return EXIT_NO_SIGNAL if self.ended == "no_signal" else 0

    def _disk_fault(self, exc: BaseException) -> OSError | None:
        """The disk fault behind `exc`, or behind the network thread's failure that `exc`
        reports (a call to a thread that has stopped says only that)."""
        found = disk_fault(exc)
        if found is None and self.server.error is not None:
            found = disk_fault(self.server.error)
        return found

    def abandon(self) -> None:
        """After a disk fault: stop as a crash would, writing nothing more (no final snapshot,
        checkpoint or ledger; producers are not told the run is over). They keep every group
        not acknowledged and reconnect to the consumer that `--resume` starts once the disk
        has room; it continues from the last checkpoint (common/files/disk.py)."""
        self.server.stop()
        if self.auth is not None:
            self.auth.stop()
        self.steps.metrics.close()
        with contextlib.suppress(OSError):
            self.loggers.close()

    def _write(self, record: dict[str, Any], got: Batch) -> None:
        """The step's metrics.jsonl line, handed to the trackers too (consumer/loggers/, their
        own thread); a completions sample at step 1 and every log.completions_every steps."""
        if self.cfg.log.report_to:
            record.update(loggers_dropped=self.loggers.dropped, loggers_failed=self.loggers.failed)
        step_record = self.steps.write(record)
        self.loggers.submit_step(step_record)
        every = self.cfg.log.completions_every
        if every and (self.version == 1 or self.version % every == 0):
            self.loggers.submit_completions(self.version, got.sample)

    def _wait_for_producers(self) -> None:
        """Hold every lease until run.wait_for_producers producers hold the first snapshot
        (logged every 30 s); a `ConfigError` naming the key after run.wait_for_producers_s."""
        need, limit_s = self.cfg.run.wait_for_producers, self.cfg.run.wait_for_producers_s
        if need <= 0:
            return
        log.info("waiting for %d producers to register and load the first snapshot", need)
        t0 = last_line = time.monotonic()
        while not self.stop_event.is_set():
            ready = self.server.ready_producers()
            if len(ready) >= need:
                hosts = sorted({f"{p}@{h}" for p, h in ready.items()})
                log.info("%d producers ready (%s): starting", len(ready), ", ".join(hosts))
                break
            self.server.check()
            self.trainer.idle()  # a sharded learner's other ranks wait with us
            now = time.monotonic()
            if limit_s and now - t0 > limit_s:
                raise ConfigError(
                    f"only {len(ready)} of run.wait_for_producers = {need} producers were ready "
                    f"within run.wait_for_producers_s = {limit_s:g} s "
                    f"({', '.join(sorted(ready)) or 'none'}): are they started, pointed at this "
                    "consumer (`asyncgrpo producer --connect`) and given their keys?"
                )
            if now - last_line > 30:
                last_line = now
                names = ", ".join(sorted(ready))
                log.info("%d of %d producers ready (%s)", len(ready), need, names)
            time.sleep(0.1)
        self.server.open_grants()

    def _collect(self) -> Batch | None:
        """Admitted groups for the step at the current version (None when asked to stop)."""
        c, out = self.cfg, Batch(tally=RewardTally(self.reward_names))
        while len(out.kept) < c.train.prompts_per_step:
            if self.stop_event.is_set():  # even while every arriving group is dropped
                return None
            t0 = time.perf_counter()
            g = self.server.next_group(timeout_s=0.1)
            out.wait_s += time.perf_counter() - t0
            if g is None:
                self.server.check()
                self.trainer.idle()
                if self.server.starving():
                    self.ended = "data"
                    return None
                continue
            if self.steps.recorder is not None:
                self.steps.recorder.group(g)
            out.tally.add(g)
            if len(out.sample) < c.log.completions_groups:
                out.sample.append(g)
            arrived_settled = self.server.settled_on_arrival(g)  # its lease ended on arrival
            why = "dropped_zero_variance" if arrived_settled else None
            why = why or verdict(
                g,
                policy_version=self.version,
                max_staleness=c.staleness.max_staleness,
                drop_zero_variance=c.train.drop_zero_variance,
            )
            if why != "dropped_stale" and self._watch(g):
                return None
            if why is None:
                if not out.kept and self.steps.step_end is not None:
                    out.round_trip_s = time.perf_counter() - self.steps.step_end
                out.kept.append(g)
                continue
            out.dropped[why] += 1
            out.dropped_ids.append((g.lease_id, why))
            self.server.drop(g, why)
        out.kept.sort(key=lambda g: g.lease_id)  # arrival order must not change the step
        return out

    def _watch(self, g: wire.Group) -> bool:
        """Count `g` in the signal watch (consumer/no_signal.py): `signal.json` every 2 s, a
        log line every 20 steps' worth of groups without a signal, the first groups as a
        completions sample before the first step; True when the budget without a signal is
        spent (the run then ends as `no_signal`)."""
        now = time.monotonic()
        watch = self.signal
        watch.add(g, now)
        self._sample_first(g)
        streak = watch.streak.groups
        if streak and streak % (20 * self.cfg.train.prompts_per_step) == 0:
            log.warning("%d groups in a row without a learning signal: %s", streak, watch.why())
        spent = watch.exhausted(now)
        if spent:
            self.ended, self.reason = "no_signal", watch.stop_reason(now)
            log.error("stopping: %s", self.reason)
        if spent or now - self.signal_said >= 2.0:
            self.signal_said = now
            RS.write_signal(self.run_dir, watch.state(now, stopped=spent))
        return spent

    def _sample_first(self, g: wire.Group) -> None:
        """The first log.completions_groups groups of a run, written to completions.jsonl as
        step 0 as soon as they are there (the rest at shutdown), so that a run that never
        steps shows what it sampled and how it scored."""
        if self.first_groups is None:
            return
        if self.version > 0 or not self.cfg.log.completions_every:
            self.first_groups = None
            return
        self.first_groups.append(g)
        if len(self.first_groups) >= self.cfg.log.completions_groups:
            self._flush_first()

    def _flush_first(self) -> None:
        if self.first_groups:
            self.loggers.submit_completions(0, self.first_groups)
        self.first_groups = None

    def _settle(self, kept: list[wire.Group], trained_step: int) -> None:
        """The step's leases end as trained (on the network thread, which moves the policy
        version new leases follow)."""
        self.server.settle_trained(kept, trained_step=trained_step)

    def _books(self) -> RF.StepSummary:
        """The ledger, producers and backpressure for the step's metrics line (its size does not
        grow with the producers)."""
        return self.server.step_summary()

    def _checkpoint(self) -> None:
        """Save learner and lease book together with how far the append-only logs had got, so a
        resumed run truncates them to exactly the state it continues from."""
        self.steps.publisher.wait()
        self.steps.metrics.flush()
        state = self.server.checkpoint_state(logs=(RF.LEASES, RF.METRICS))
        if self.steps.recorder is not None:  # the stream as far as this checkpoint (durable)
            name, size = self.steps.recorder.position()
            state = dataclasses.replace(state, log_sizes={**state.log_sizes, name: size})
        self.steps.checkpoint(self.run_dir, state)

    def _let_producers_hear_the_end(self) -> None:
        """Keep answering so producers learn the run is over and exit, whether the run ended by
        itself or by a signal (unless a second signal says hurry): a few heartbeats (of the
        period the consumer sends: common/net/heartbeat.py) for the registered ones; after a resume,
        up to the producer timeout from the start for those of the previous incarnation that
        have not registered again yet."""
        beat_s, timeout_s = self.server.heartbeat_timing()
        deadline = time.monotonic() + 3 * beat_s + 1.0
        restored_deadline = self.started + max(timeout_s, 3 * beat_s + 1.0)
        if self.stop_asked is not None:  # a stop request ends the run within STOP_WAIT_S
            restored_deadline = min(restored_deadline, self.stop_asked + STOP_WAIT_S)
        while not self.hurry.is_set():
            if self.server.all_told_finished():
                return
            restored = self.server.awaiting_restored()
            if time.monotonic() >= (max(deadline, restored_deadline) if restored else deadline):
                log.warning(
                    "some producers did not hear that the run is over: they stop by "
                    "themselves after net.consumer_timeout_s"
                )
                return
            time.sleep(0.05)

    def shutdown(self) -> None:
        """Stop granting, final snapshot, expire open leases, checkpoint, `final.json` (the
        version the run ended with), balanced ledger, producers told."""
        self.server.stop_granting()
        self._flush_first()
        try:
            if self.steps.published != self.version:
                self.steps.publish()
            self.steps.publisher.close()
            self.server.expire_open("shutdown")
            self._checkpoint()
            if self.steps.recorder is not None:
                self.steps.recorder.close()
            snap.write_final(
                self.run_dir, self.steps.published, ended=self.ended, reason=self.reason
            )
            self.trainer.close()  # a sharded learner's other ranks stop here
        finally:
            self.server.expire_open("shutdown")
            self.server.flush_ledger()
            balance = self.server.balance()
            self._let_producers_hear_the_end()
            self.server.stop()
            if self.auth is not None:
                self.auth.stop()
            self.ctx.term()
            self.steps.metrics.close()
            self.loggers.close()
            if self.cores is not None:
                self.cores.close()
        log.info("ledger: %s", balance.to_json())
        if not balance.ok:
            raise AssertionError(f"ledger does not balance: {balance.to_json()}")


def _reuse_ports(cfg: Config, run_dir: Path) -> Config:
    """A resumed consumer listens where the old one did (ports 0 = the previous ports), so its
    producers reconnect by themselves."""
    path = run_dir / RF.ENDPOINTS
    if not path.exists():
        return cfg
    old = RF.read_endpoints(path).ports()
    net = cfg.net
    ports = {
        f"net.{k}_port": old[k]
        for k in ("control", "rollouts", "announce", "data")
        if getattr(net, f"{k}_port") == 0 and k in old
    }
    return config_mod.override(cfg, ports)


def install_signal_handlers(stop: threading.Event, hurry: threading.Event) -> None:
    """The first SIGINT/SIGTERM sets `stop` (finish the step, shut down cleanly); a second one
    sets `hurry` (do not wait for producers to hear the end)."""

    def handler(signum: int, _frame: Any) -> None:
        if stop.is_set():
            log.info("signal %d again: not waiting for producers to hear the end", signum)
            hurry.set()
            return
        log.info("signal %d: finishing the current step, then shutting down", signum)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def main(cfg: Config, run_dir: Path) -> int:
    """The consumer; under torchrun (world size > 1) rank 0 runs it and the other ranks follow
    rank 0's orders. A rank that died or hangs ends it with one line and exit code 1."""
    from consumer.train import host_memory
    from consumer.train.ranks import RankFailure, World

    host_memory.release_freed_blocks()
    world = World.from_env()
    if world.size > 1 and cfg.train.simulate_step_s:
        raise ConfigError(
            "train.simulate_step_s replaces the model: run it as one process, not under torchrun"
        )
    try:
        if not world.main:
            from consumer.train.sharded import follow

            return follow(cfg, run_dir, world)
        learner = Learner(cfg, run_dir)
        install_signal_handlers(learner.stop_event, learner.hurry)
        log.info("host %s", socket.gethostname())
        return learner.run()
    except RankFailure as exc:
        log.error("%s; `--resume` continues from the last checkpoint", exc)
        return 1
    except Exception as exc:
        fault = disk_fault(exc)
        if fault is None:
            raise
        log.error("%s", stop_line(fault))
        return 1
