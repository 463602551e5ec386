"""What the stress sweep does while one setting runs (the launcher's `on_tick`, every 0.25 s).

`Watcher` reads the run's `metrics.jsonl` as it grows and:
- keeps the snapshots the sweep will evaluate, as hard links under the run directory (the
  learner deletes all but the newest `snapshot.keep_last`): `at_steps/` holds version
  `--steps` (the model at equal steps) and `at_sync_time/` the newest version whose step ended
  within the synchronous setting's wall-clock `t_sync_s` (the model at equal wall-clock; the
  learner's clock `time_s`, which starts once every producer is ready). A version that was
  superseded or already deleted is replaced by the newest kept version below it; which one was
  taken is in `captured` and, on disk, in each directory's manifest;
- with `until_s`, asks the consumer to finish (SIGINT: final step, snapshot, ledger) once the
  run has both taken `steps` steps and run for `until_s` seconds, so that an asynchronous setting
  faster than the synchronous one is still seen at the synchronous setting's wall-clock;
- raises `SettingFailed` when every local producer has failed for good (non-zero exits, restarts
  used up) while the consumer still waits for groups that will never come;
- samples the machine's 1-minute load average (`os.getloadavg`, the setting's own processes
  included) at every tick: `load_mean` is the mean over the setting (what the sweep's summary
  weighs its timings by, launch/stress/verdict.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path

from common.files import run_files as RF
from common.weights import snapshot as snap
from launch.dashboard import MetricsTail
from launch.local import Supervisor

AT_STEPS, AT_SYNC_TIME = "at_steps", "at_sync_time"


class SettingFailed(RuntimeError):
    """A setting cannot finish; its message goes into results.csv."""


class Watcher:
    def __init__(
        self, run_dir: Path, *, steps: int, t_sync_s: float | None, until_s: float | None
    ) -> None:
        self.run_dir, self.steps, self.t_sync_s, self.until_s = run_dir, steps, t_sync_s, until_s
        self.tail = MetricsTail(run_dir / RF.METRICS)
        self.targets = {AT_STEPS: steps}  # wanted version per capture directory
        if t_sync_s is not None:
            self.targets[AT_SYNC_TIME] = 0
        self.captured: dict[str, int] = {}  # version held per capture directory
        self.stopping = False
        self.loads: list[float] = []

    @property
    def load_mean(self) -> float | None:
        """The mean 1-minute load average over the ticks so far (None before the first)."""
        return sum(self.loads) / len(self.loads) if self.loads else None

    def __call__(self, sup: Supervisor) -> None:
        self.poll()
        self.loads.append(os.getloadavg()[0])
        last = self.tail.records[-1] if self.tail.records else None
        if (
            self.until_s is not None
            and not self.stopping
            and last is not None
            and last.step >= self.steps
            and last.time_s >= self.until_s
            and sup.consumer is not None
        ):
            self.stopping = True
            sup.consumer.signal(signal.SIGINT)
        codes = {c.name: c.exit_codes[-1] for c in sup.producers if c.finished and c.exit_codes}
        if sup.producers and len(codes) == len(sup.producers) and all(codes.values()):
            raise SettingFailed(
                f"every producer exited for good ({codes}): see "
                f"{sup.producers[0].log_path.name} in {self.run_dir}"
            )

    def poll(self) -> None:
        """Read new steps, move the targets, link what is on disk (also once after the run)."""
        for rec in self.tail.poll():
            if self.t_sync_s is not None and rec.time_s <= self.t_sync_s:
                self.targets[AT_SYNC_TIME] = rec.step
        root = self.run_dir / "snapshots"
        for name, target in self.targets.items():
            kept = [v for v in snap.list_versions(root) if v <= target]
            if kept and kept[-1] > self.captured.get(name, -1):
                with contextlib.suppress(FileNotFoundError):  # deleted meanwhile: next tick
                    _link(snap.snapshot_dir(root, kept[-1]), self.run_dir / name)
                    self.captured[name] = kept[-1]


def _link(source: Path, dest: Path) -> None:
    """`dest` becomes a directory of hard links to `source`'s weights and manifest (atomic)."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name in (snap.WEIGHTS_FILE, snap.MANIFEST_FILE):
        os.link(source / name, tmp / name)
    old = dest.with_name(dest.name + ".old")
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
