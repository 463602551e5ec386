"""A replaying learner: trains on a recorded run's batches in the recorded order, with no
producers and no network (`asyncgrpo replay`, launch/cli/replay.py).

What it owns: the step loop of a replay (read each step's groups back from the original run's
stream, consumer/stream/reader.py; `Trainer.step`; publish; one metrics line; held-out accuracy
at the run's cadence, in a process of its own: consumer/eval_process.py), the replay's ledger
(every recorded group trained or dropped as it was), and the comparison of snapshot hashes
with the original's. What it does not do: decide which settings may change
(consumer/stream/rules.py), plots (launch/report.py).

Determinism: a step's result depends on the learner's state, the config and the ordered groups.
The replay builds the trainer as the learner does (same seed, same model directory), feeds it
the recorded groups in their order and publishes the same versions, every one written (none
superseded: a publication waits until the writer has taken the one before, never for a write),
so with the run's own config on the same kind of machine every snapshot's BLAKE3 hash equals
the original's of that version: on a CPU always, on a GPU with the settings docs/replay.md
lists. A step whose micro-batch passes differ from the recording's
means the config does not match it: a `StreamError` naming the file and the step.

The replay records its own stream (run.record_stream), so it can itself be replayed or verified.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from common import wire
from common.config import Config
from common.config.run import reward_names
from common.errors import ConfigError, StreamError
from common.files import metrics as M
from common.files import run_files as RF
from common.host.model_dir import local_model_dir
from common.weights import snapshot as snap
from consumer.eval_process import EvalProcess, EvalSpec
from consumer.evaluate import PeriodicEval
from consumer.reward_tally import RewardTally
from consumer.server.server import group_limits
from consumer.snapshots.publisher import Publisher
from consumer.staleness import lag
from consumer.stream.reader import Recording, Step, load_group
from consumer.stream.recorder import Recorder
from consumer.stream.records import StepEntry
from consumer.train import checkpoint
from consumer.train.protocol import Trainer

log = logging.getLogger("asyncgrpo.consumer")


@dataclass
class Replayed:
    """What a replay did: the versions it published with their hashes, and its wall time."""

    steps: int = 0
    hashes: dict[int, str] = field(default_factory=dict)
    wall_s: float = 0.0
    start_version: int = 0


class Replay:
    def __init__(
        self, cfg: Config, run_dir: Path, recording: Recording, source: Path, *, check_passes: bool
    ) -> None:
        self.cfg, self.run_dir, self.recording, self.source = cfg, run_dir, recording, source
        self.check_passes = check_passes  # the run's pass settings: the recorded counts apply
        self.model_dir = local_model_dir(cfg.model.path)
        from consumer.train import make_trainer

        self.trainer: Trainer = make_trainer(cfg, self.model_dir)
        self.limits = group_limits(
            cfg, int(cfg.net.max_message_mib * (1 << 20)), vocab_size=self.trainer.vocab_size
        )
        self.recorder = Recorder(run_dir) if cfg.run.record_stream else None
        self.out = Replayed()
        self._lock = threading.Lock()
        self.publisher = Publisher(
            run_dir / RF.SNAPSHOTS,
            self.model_dir,
            keep_last=cfg.snapshot.keep_last,
            fsync=cfg.snapshot.fsync,
            on_published=self._on_published,
        )
        self.metrics = M.JsonlWriter(run_dir / RF.METRICS)
        self.heldout = PeriodicEval(cfg, self.model_dir)
        self.evals: EvalProcess | None = None
        if self.heldout.enabled:  # started now: its imports overlap the first steps
            self.evals = EvalProcess(
                EvalSpec(str(self.model_dir), cfg.train.eval_size, cfg.run.seed,
                         cfg.sampling.max_new_tokens)
            )  # fmt: skip
        self._held: list[dict[str, Any]] = []  # metrics lines waiting for their evaluation
        self.counts: Counter[str] = Counter()
        self.version = self.published = 0

    def _on_published(self, info: wire.SnapshotInfo) -> None:
        with self._lock:
            self.out.hashes[info.version] = info.hash
        if self.recorder is not None:
            self.recorder.snapshot(info)

    def start_from(self, version: int) -> None:
        """Begin at the original run's checkpoint of `version` (its current one)."""
        path = checkpoint.current(self.source)
        found = checkpoint.version_of(path) if path is not None else None
        if found != version:
            has = f"only its checkpoint of version {found}" if found is not None else "none"
            raise ConfigError(
                f"--from-checkpoint {version}: {self.source} holds {has} (a run keeps its "
                "latest checkpoint)"
            )
        assert path is not None
        self.trainer.load_checkpoint(path)
        self.version = self.out.start_version = version

    def run(self, steps: int | None) -> Replayed:
        """Replay up to `steps` optimizer steps (None: every recorded one)."""
        todo = [s for s in self.recording.steps if s.entry.version >= self.version]
        if todo and todo[0].entry.version != self.version:
            raise StreamError(
                f"{todo[0].path}: the recording starts at step {todo[0].entry.version}, "
                f"not at version {self.version}"
            )
        todo = todo[:steps] if steps is not None else todo
        t_start = last = time.perf_counter()
        self._publish()
        try:
            for step in todo:
                record = self._step(step, t_start, last)
                last = time.perf_counter()
                if self.evals is not None and self.heldout.due(self.version):
                    self.evals.submit(self.version, self.trainer.eval_model().state_dict())
                self._held.append(record)
                self._write_metrics(self.evals.results() if self.evals else {})
            if self.evals is not None:
                self._write_metrics(self.evals.drain())
        finally:
            self._finish()
        self.out.wall_s = time.perf_counter() - t_start
        return self.out

    def _step(self, step: Step, t_start: float, last: float) -> dict[str, Any]:
        e, v = step.entry, self.version
        groups = [load_group(at, self.limits, step=v) for at in step.groups]
        if self.recorder is not None:
            for g in groups:
                self.recorder.group(g)
        metrics = self.trainer.step(groups)
        _check_like_recorded(step, metrics, self.cfg, passes=self.check_passes)
        self.version = v + 1
        self.out.steps += 1
        self.counts["trained"] += len(groups)
        self.counts.update(why for _, why in e.dropped)
        tokens = sum(g.num_tokens for g in groups)
        if self.recorder is not None:
            self.recorder.step(
                StepEntry(
                    version=v, kept=e.kept, dropped=e.dropped, seed=self.cfg.run.seed,
                    micro_batches=metrics.get("micro_batches"), lr=metrics.get("lr"),
                    tokens=tokens,
                )
            )  # fmt: skip
        t0 = time.perf_counter()
        if self.version % self.cfg.staleness.publish_every == 0:
            self._publish()
        now = time.perf_counter()
        rewards = np.concatenate([g.rewards for g in groups])
        lags = [lag(v, g) for g in groups]
        tally = RewardTally(reward_names([r.fn for r in self.cfg.rewards.fns]))
        for g in groups:  # the trained ones: what the recorded step consumed
            tally.add(g)
        return {
            "step": self.version, "world_size": self.trainer.world_size,
            "time_s": now - t_start, "unix_time": time.time(), "step_wall_s": now - last,
            "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
            **tally.fields(), "staleness_mean": float(np.mean(lags)),
            "staleness_max": int(max(lags)),
            "staleness_hist": {str(k): n for k, n in Counter(lags).items()},
            "tokens_per_s": tokens / max(now - last, 1e-9), "learner_idle_frac": 0.0,
            "wait_s": 0.0, "publish_submit_s": now - t0,
            "snapshot_write_s": self.publisher.last_write_s,
            "snapshots_superseded": self.publisher.num_superseded,
            "num_completion_tokens": tokens, "groups_trained": self.counts["trained"],
            "groups_dropped_stale": self.counts["dropped_stale"],
            "groups_dropped_zero_variance": self.counts["dropped_zero_variance"],
            "groups_rejected_invalid": 0, "groups_expired": 0, "leases_open": 0,
            "rejected_messages": 0, **metrics,
        }  # fmt: skip

    def _write_metrics(self, evaluated: dict[int, dict[str, float]]) -> None:
        """Fill in finished evaluations; write the lines, in order, that wait for none."""
        for record in self._held:
            record.update(evaluated.get(record["step"], {}))
        waiting = self.evals.waiting if self.evals is not None else frozenset()
        while self._held and self._held[0]["step"] not in waiting:
            self.metrics.write(M.StepRecord(**self._held.pop(0)))

    def _publish(self) -> None:
        """Publish the current version. Every version is written (a superseded one would have
        no hash to compare): the submit waits until the writer has taken the version before,
        then the writer works beside the next step."""
        import torch

        dtype = torch.bfloat16 if self.cfg.snapshot.dtype == "bfloat16" else torch.float32
        self.publisher.wait_queued()
        fence = self.publisher.submit(
            self.trainer.weights(), version=self.version, step=self.version, dtype=dtype
        )
        self.trainer.hold_weights(fence)
        self.published = self.version

    def _finish(self) -> None:
        if self.evals is not None:
            self.evals.close()
        for record in self._held:  # stopped by an error: the steps trained, without evaluation
            self.metrics.write(M.StepRecord(**record))
        self.publisher.close()
        if self.recorder is not None:
            self.recorder.close()
        self.metrics.close()
        snap.write_final(self.run_dir, self.published)
        c = self.counts
        balance = RF.Balance(
            issued=sum(c.values()), trained=c["trained"], dropped_stale=c["dropped_stale"],
            dropped_zero_variance=c["dropped_zero_variance"], ok=True,
        )  # fmt: skip
        RF.write_ledger(self.run_dir, RF.Ledger(balance=balance, policy_version=self.version))
        self.trainer.close()


def _check_like_recorded(step: Step, metrics: dict[str, Any], cfg: Config, *, passes: bool) -> None:
    """The trainer split the step as the recording says, or the config does not match it."""
    want, got = step.entry.micro_batches, metrics.get("micro_batches")
    if passes and want is not None and got is not None and want != got:
        raise StreamError(
            f"{step.path}: step {step.entry.version}: {got} micro-batches where the recording "
            f"made {want}: the config does not match the recording (train.micro_batch_tokens "
            f"= {cfg.train.micro_batch_tokens}, model.attention = {cfg.model.attention!r})"
        )
    if step.entry.seed != cfg.run.seed:
        raise StreamError(
            f"{step.path}: step {step.entry.version} was recorded with run.seed = "
            f"{step.entry.seed}, this config has {cfg.run.seed}"
        )


@dataclass(frozen=True, slots=True)
class Comparison:
    """Snapshot hashes of a replay against the original's: versions compared, the first that
    differs (None: none), and the largest |Δparam| there (None: a snapshot is not on disk)."""

    compared: list[int]
    first_diff: int | None
    max_abs_delta: float | None


def compare(original: dict[int, str], replayed: dict[int, str], *, source: Path,
            run_dir: Path) -> Comparison:  # fmt: skip
    """Compare the hashes of the versions both runs published."""
    both = sorted(set(original) & set(replayed))
    diff = next((v for v in both if original[v] != replayed[v]), None)
    delta = None
    if diff is not None:
        delta = max_abs_delta(
            snap.snapshot_dir(source / RF.SNAPSHOTS, diff),
            snap.snapshot_dir(run_dir / RF.SNAPSHOTS, diff),
        )
    return Comparison(both, diff, delta)


def max_abs_delta(a: Path, b: Path) -> float | None:
    """max |a - b| over every tensor of two snapshot directories (None if one is gone)."""
    from safetensors.torch import load_file

    files = [p / snap.WEIGHTS_FILE for p in (a, b)]
    if not all(f.exists() for f in files):
        return None
    wa, wb = (load_file(f) for f in files)
    return max(float((wa[k].double() - wb[k].double()).abs().max()) for k in wa if k in wb)
