"""One optimizer step, the learner's and a replay's alike: train a batch, publish, record the
stream, build the step's metrics line. The learner (consumer/learner.py) and the replay
(consumer/replay.py) differ only in where a batch comes from (admitted groups from the network
thread, or a recorded step read back) and in what ends its leases; both call `Steps`.

`Steps(cfg, run_dir, trainer, model_dir, ...)` owns the publisher (snapshots under
RUN/snapshots; for the learner also what network fetchers need: `for_network`), the recorder of
RUN/stream/ (with `run.record_stream`) and the metrics.jsonl writer. One step:

    Trainer.step(batch.kept) → version += 1 → `settle(kept, trained_step)` (the caller's ledger)
    → publish every `staleness.publish_every` versions → the stream's entry for the step
    → the metrics line (`fields`: rewards, staleness, tokens, idle, publication, ledger totals,
      the trainer's metrics; the producers and backpressure when the books carry them)

A replay publishes every version it reaches (`every_version`: a superseded snapshot would have
no hash to compare), waiting until the writer has taken the one before, never for a write.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from common import wire
from common.config import Config
from common.files import metrics as M
from common.files import run_files as RF
from consumer.reward_tally import RewardTally
from consumer.snapshots.fetch_files import FetchFiles, snapshot_chunk_bytes
from consumer.snapshots.publisher import Publisher
from consumer.staleness import lag
from consumer.stream.recorder import Recorder
from consumer.stream.records import StepEntry
from consumer.train import checkpoint
from consumer.train.protocol import Trainer


@dataclass
class Batch:
    """A step's groups: those it trains (`kept`, in lease-id order), those dropped on the way
    (`dropped_ids`: lease id and why), every arrived group's rewards (`tally`), the first few
    groups for the completions sample, and the learner's wait for them."""

    kept: list[wire.Group] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    dropped_ids: list[tuple[int, str]] = field(default_factory=list)
    tally: RewardTally = field(default_factory=lambda: RewardTally([]))
    sample: list[wire.Group] = field(default_factory=list)  # the first few (log.completions_*)
    wait_s: float = 0.0
    round_trip_s: float | None = None  # previous step's end -> first kept group


# What a metrics line says of the ledger: the network thread's summary (the learner), or the
# replay's own counts (no producers, no backpressure).
Books = RF.StepSummary | RF.Balance


class Steps:
    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        trainer: Trainer,
        model_dir: Path | None,
        *,
        on_published: Callable[[wire.SnapshotInfo], None],
        for_network: bool,
        every_version: bool = False,
        resume_from: tuple[str, int] | None = None,
        version: int = 0,
    ) -> None:
        self.cfg, self.trainer = cfg, trainer
        self.every_version = every_version
        self._on_published = on_published
        # RUN/stream/: what the learner consumed, for `asyncgrpo replay` (consumer/stream/)
        self.recorder = (
            Recorder(run_dir, resume_from=resume_from) if cfg.run.record_stream else None
        )
        snapshot = cfg.snapshot
        fetch_files = FetchFiles(
            chunk_bytes=snapshot_chunk_bytes(cfg),
            anchor_every=snapshot.anchor_every,
            max_ratio=snapshot.delta_max_ratio,
        )
        self.publisher = Publisher(
            run_dir / RF.SNAPSHOTS,
            model_dir,
            keep_last=snapshot.keep_last,
            delay_s=snapshot.delay_s if for_network else 0.0,
            fsync=snapshot.fsync,
            fetch_files=fetch_files if for_network else None,
            on_published=self._published,
            adapter=trainer.adapter,
        )
        self.metrics = M.JsonlWriter(run_dir / RF.METRICS)
        self.version = version  # the policy version: optimizer steps taken
        self.published = -1  # the newest version submitted to the publisher
        self.last_published: wire.SnapshotInfo | None = None  # set on the publisher's thread
        self.step_end: float | None = None  # perf_counter when the last optimizer step ended

    def _published(self, info: wire.SnapshotInfo) -> None:
        """The publisher's thread: a snapshot is ready; record its hash, then tell the owner."""
        self.last_published = info
        if self.recorder is not None:
            self.recorder.snapshot(info)
        self._on_published(info)

    def weights_file(self) -> wire.SnapshotInfo | None:
        """The published snapshot of the current version when its file holds exactly the
        learner's weights (float32): a checkpoint links it instead of writing them again."""
        info = self.last_published
        same = info is not None and info.version == self.version
        return info if same and self.cfg.snapshot.dtype == "float32" else None

    def checkpoint(self, run_dir: Path, book_state: RF.BookState) -> None:
        """A checkpoint of the current version (consumer/train/checkpoint.py), its weights
        linked from the published snapshot when that file holds them (`weights_file`)."""
        published = self.weights_file()
        checkpoint.save(
            run_dir,
            trainer=self.trainer,
            version=self.version,
            book_state=book_state,
            published=published,
        )

    def publish(self, *, wait: bool = False) -> None:
        """Hand the current version's weights to the publisher (one copy); `wait`: until it is
        written."""
        import torch

        dtype = torch.bfloat16 if self.cfg.snapshot.dtype == "bfloat16" else torch.float32
        if self.every_version:
            self.publisher.wait_queued()
        fence = self.publisher.submit(
            self.trainer.weights(), version=self.version, step=self.version, dtype=dtype
        )
        self.trainer.hold_weights(fence)
        self.published = self.version
        if wait:
            self.publisher.wait()

    def train(
        self,
        batch: Batch,
        *,
        started: float,
        last: float,
        settle: Callable[[list[wire.Group], int], None],
        books: Callable[[], Books],
        check: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """One optimizer step on `batch.kept` (module docstring); its metrics line's fields
        (evaluation aside). `started`, `last`: perf_counter at the loop's start and at the end
        of the previous step; `check(metrics)` may refuse the step before anything is published
        (a replay whose config does not match its recording)."""
        v = self.version
        metrics = self.trainer.step(batch.kept)
        if check is not None:
            check(metrics)
        step_end = time.perf_counter()
        self.version = v + 1
        settle(batch.kept, v)
        publish_s = 0.0
        if self.version % self.cfg.staleness.publish_every == 0:
            t0 = time.perf_counter()
            self.publish()
            publish_s = time.perf_counter() - t0
        now = time.perf_counter()
        tokens = sum(g.num_tokens for g in batch.kept)
        if self.recorder is not None:
            entry = StepEntry(
                version=v,
                kept=tuple(g.lease_id for g in batch.kept),
                dropped=tuple(batch.dropped_ids),
                seed=self.cfg.run.seed,
                micro_batches=metrics.get("micro_batches"),
                lr=metrics.get("lr"),
                tokens=tokens,
                threads=tuple(metrics.get("pass_threads") or ()),
                layer_threads=bool(getattr(self.trainer, "threads_per_layer", False)),
            )
            self.recorder.step(entry)
        self.step_end = step_end
        times = (started, last, now)
        return self.fields(batch, v, books(), metrics, publish_s=publish_s, times=times)

    def fields(
        self,
        batch: Batch,
        trained_step: int,
        books: Books,
        metrics: dict[str, Any],
        *,
        publish_s: float,
        times: tuple[float, float, float],
    ) -> dict[str, Any]:
        """The step's `StepRecord` fields (common/files/metrics.py), evaluation aside; `times`:
        perf_counter at the loop's start, the previous step's end and this one's."""
        started, last, now = times
        rewards = np.concatenate([g.rewards for g in batch.kept])
        lags = [lag(trained_step, g) for g in batch.kept]
        tokens = sum(g.num_tokens for g in batch.kept)
        totals = books.totals if isinstance(books, RF.StepSummary) else books
        out = {
            "step": self.version,
            "world_size": self.trainer.world_size,
            "time_s": now - started,
            "unix_time": time.time(),
            "step_wall_s": now - last,
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            **batch.tally.fields(),
            "staleness_mean": float(np.mean(lags)),
            "staleness_max": int(max(lags)),
            "staleness_hist": {str(k): n for k, n in Counter(lags).items()},
            "tokens_per_s": tokens / max(now - last, 1e-9),
            "learner_idle_frac": batch.wait_s / max(now - last, 1e-9),
            "wait_s": batch.wait_s,
            "round_trip_s": batch.round_trip_s,
            "publish_submit_s": publish_s,
            "snapshot_write_s": self.publisher.last_write_s,
            "snapshots_superseded": self.publisher.num_superseded,
            "num_completion_tokens": tokens,
            "groups_trained": totals.trained,
            "groups_dropped_stale": totals.dropped_stale,
            "groups_dropped_zero_variance": totals.dropped_zero_variance,
            "groups_rejected_invalid": totals.rejected_invalid,
            "groups_expired": totals.expired,
            "leases_open": totals.open,
            "rejected_messages": 0,
        }
        if isinstance(books, RF.StepSummary):
            out |= {
                "rejected_messages": books.rejected_messages,
                "producers_live": books.producers_live,
                "producers_by_state": books.producers_by_state,
                **books.backpressure.to_json(),
            }
        return out | metrics

    def write(self, record: dict[str, Any]) -> M.StepRecord:
        """The step's metrics.jsonl line (saying how many lines before it a failing disk lost,
        if any: common/files/metrics.py `JsonlWriter`)."""
        if self.metrics.lost:
            record = {**record, "metrics_lines_lost": self.metrics.lost}
        step_record = M.StepRecord(**record)
        self.metrics.write(step_record)
        return step_record
