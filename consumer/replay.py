"""A replaying learner: trains on a recorded run's batches in the recorded order, with no
producers and no network (`asyncgrpo replay`, launch/cli/replay.py).

What it owns: the step loop of a replay (read each step's groups back from the original run's
stream, consumer/stream/reader.py, and train them with the learner's own step, consumer/step.py:
`Trainer.step`, publish, the stream's entry, the metrics line; held-out accuracy at the run's
cadence, in a process of its own: consumer/evaluation/child.py), the replay's ledger
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

import dataclasses
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import wire
from common.config import Config
from common.config.run import reward_names
from common.errors import ConfigError, StreamError
from common.files import run_files as RF
from common.host.core_board import Recorded
from common.host.model_dir import local_model_dir
from common.weights import snapshot as snap
from consumer.evaluation import evaluate_beside_replay
from consumer.reward_tally import RewardTally
from consumer.server.wire_terms import group_limits
from consumer.step import Batch, Steps
from consumer.stream.reader import Recording, Step, load_group
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
        self.out = Replayed()
        self._lock = threading.Lock()
        self.steps = Steps(
            cfg,
            run_dir,
            self.trainer,
            self.model_dir,
            on_published=self._on_published,
            for_network=False,
            every_version=True,
        )
        self.evals = evaluate_beside_replay(cfg, self.model_dir)
        # metrics lines waiting for their evaluation, by the version they end at
        self._held: list[tuple[int, dict[str, Any]]] = []
        self.counts: Counter[str] = Counter()
        self.names = reward_names([r.fn for r in cfg.rewards.fns])

    @property
    def version(self) -> int:
        """The policy version: optimizer steps replayed (from the start version)."""
        return self.steps.version

    def _on_published(self, info: wire.SnapshotInfo) -> None:
        with self._lock:
            self.out.hashes[info.version] = info.hash

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
        self.steps.version = self.out.start_version = version

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
        self.steps.publish()
        try:
            for step in todo:
                record = self._step(step, t_start, last)
                last = time.perf_counter()
                if self.evals is not None and self.evals.due(self.version):
                    self.evals.submit(self.version, self.trainer.eval_model().state_dict())
                self._held.append((self.version, record))
                self._write_metrics(self.evals.results() if self.evals else {})
            if self.evals is not None:
                self._write_metrics(self.evals.drain())
        finally:
            self._finish()
        self.out.wall_s = time.perf_counter() - t_start
        return self.out

    def _step(self, step: Step, t_start: float, last: float) -> dict[str, Any]:
        """One recorded step trained again: its groups in their recorded order, its drops as
        they were."""
        groups = [load_group(at, self.limits, step=self.version) for at in step.groups]
        recorder = self.steps.recorder
        tally = RewardTally(self.names)
        for g in groups:  # the trained ones: what the recorded step consumed
            if recorder is not None:
                recorder.group(g)
            tally.add(g)
        batch = Batch(kept=groups, dropped_ids=list(step.entry.dropped), tally=tally)
        self.counts.update(why for _, why in step.entry.dropped)

        def check(metrics: dict[str, Any]) -> None:
            _check_like_recorded(step, metrics, self.cfg, passes=self.check_passes)

        # the passes' threads as recorded (they change a CPU step's rounding); an older
        # recording without them: the config's model.torch_threads
        threads = step.entry.threads
        recorded = Recorded(threads, per_layer=step.entry.layer_threads) if threads else None
        self.trainer.share_cores(recorded)

        record = self.steps.train(
            batch, started=t_start, last=last, settle=self._settle, books=self._books, check=check
        )
        self.out.steps += 1
        return record

    def _settle(self, kept: list[wire.Group], trained_step: int) -> None:
        """The replay's own ledger: every recorded group trained or dropped as it was."""
        self.counts["trained"] += len(kept)

    def _books(self) -> RF.Balance:
        c = self.counts
        return RF.Balance(
            issued=sum(c.values()),
            trained=c["trained"],
            dropped_stale=c["dropped_stale"],
            dropped_zero_variance=c["dropped_zero_variance"],
        )

    def _write_metrics(self, evaluated: dict[int, dict[str, float]]) -> None:
        """Fill in finished evaluations; write the lines, in order, that wait for none."""
        for version, record in self._held:
            record.update(evaluated.get(version, {}))
        waiting = self.evals.waiting if self.evals is not None else frozenset()
        while self._held and self._held[0][0] not in waiting:
            self.steps.write(self._held.pop(0)[1])

    def _finish(self) -> None:
        if self.evals is not None:
            self.evals.close()
        for _, record in self._held:  # stopped by an error: the steps trained, not evaluated
            self.steps.write(record)
        self.steps.publisher.close()
        if self.steps.recorder is not None:
            self.steps.recorder.close()
        self.steps.metrics.close()
        snap.write_final(self.run_dir, self.steps.published)
        balance = dataclasses.replace(self._books(), ok=True)
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


def compare(
    original: dict[int, str], replayed: dict[int, str], *, source: Path, run_dir: Path
) -> Comparison:
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
