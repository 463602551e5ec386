"""Experiment trackers on their own thread (consumer/loggers/): TensorBoard's event files and a
W&B offline run read back with their own formats, completions.jsonl, a resumed W&B run, and a
tracker that fails or stalls never reaching training."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from step_records import BASE

from common import config as C
from common import wire
from common.files import completions_file as CF
from common.files import metrics as M
from consumer.loggers import make_loggers
from consumer.loggers import thread as T
from tests import wandb_records as W

REWARDS = ['rewards.fns=[{fn="exact_match", weight=1.0}, {fn="boxed_format", weight=0.5}]']


def _set_offline(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(home / "wandb-home"))


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch):
    _set_offline(tmp_path, monkeypatch)


def _config(*report_to: str) -> C.Config:
    quoted = ", ".join(f'"{r}"' for r in report_to)
    return C.apply_overrides(C.Config(), [f"log.report_to=[{quoted}]", *REWARDS])


def _record(step: int) -> M.StepRecord:
    means = {"exact_match": 0.1 * step, "boxed_format": 1.0}
    return M.StepRecord(
        **{**BASE, "step": step, "reward_mean_seen": 0.25 * step, "reward_fn_means": means}
    )


def _group(index: int) -> wire.Group:
    return wire.Group(
        lease_id=index, producer_id="p", prompt_index=index, behavior_version=0,
        prompt_ids=np.array([5, 6], np.int32), completion_ids=np.array([7, 8, 9], np.int32),
        completion_lens=np.array([1, 2], np.int32), behavior_logp=np.full(3, -1.0, np.float32),
        token_versions=np.zeros(0, np.int32), rewards=np.array([1.5, 0.0], np.float32),
        finish_reasons=("stop", "length"), temperature=1.0,
        reward_parts=np.array([1.0, 0.0, 1.0, 0.0], np.float32),
    )  # fmt: skip


def _wandb_file(run_dir: Path, run_id: str) -> Path:
    (path,) = run_dir.glob(f"wandb/offline-run-*-{run_id}*/run-{run_id}.wandb")
    return path


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory) -> tuple[Path, tuple[int, int]]:
    """A run directory both trackers wrote steps 1-3 and a completions sample of step 3 to (one
    W&B start, the slow part, for the two tests that read it); (failed, dropped) after closing."""
    run_dir = tmp_path_factory.mktemp("logged-run")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _set_offline(run_dir.parent / f"{run_dir.name}-home", monkeypatch)
        loggers = make_loggers(_config("tensorboard", "wandb"), run_dir, None)
        for step in (1, 2, 3):
            loggers.submit_step(_record(step))
        loggers.submit_completions(3, [_group(4)])
        loggers.close()
    return run_dir, (loggers.failed, loggers.dropped)


def test_metrics_config_and_completions_reach_tensorboard_wandb_and_the_run_dir(logged_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, failed_dropped = logged_run
    assert failed_dropped == (0, 0)

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    seen = [(e.step, e.value) for e in events.Scalars("reward/reward_mean_seen")]
    assert seen == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert [e.step for e in events.Scalars("reward/fn/exact_match")] == [1, 2, 3]
    assert {"rollout/groups_trained", "staleness/hist/0", "throughput/tokens_per_s",
            "weights/snapshot_write_s"} <= set(events.Tags()["scalars"])  # fmt: skip
    assert {"config/text_summary", "completions/text_summary"} <= set(events.Tags()["tensors"])
    (config_text,) = events.Tensors("config/text_summary")
    text = config_text.tensor_proto.string_val[0].decode()
    assert text.startswith("```toml\n[run]\n")
    assert '"wandb"' in text

    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    path = _wandb_file(run_dir, run_id)
    rows = W.history(path)
    metrics = [r for r in rows if "reward/reward_mean_seen" in r]
    assert [(r["policy_version"], r["reward/reward_mean_seen"]) for r in metrics] == [
        (1, 0.25), (2, 0.5), (3, 0.75)]  # fmt: skip
    (table,) = [r for r in rows if "completions/_type" in r]  # a wandb.Table
    assert (table["policy_version"], table["completions/nrows"]) == (3, 2)
    assert W.config(path)["log"]["report_to"] == ["tensorboard", "wandb"]

    written = CF.read(run_dir)
    assert [(r.step, r.prompt_index, r.reward, r.length, r.finish_reason) for r in written] == [
        (3, 4, 1.5, 1, "stop"), (3, 4, 0.0, 2, "length")]  # fmt: skip
    assert written[0].rewards == {"exact_match": 1.0, "boxed_format": 1.0}
    assert written[0].prompt == "5 6"  # no model: the ids as numbers


def test_a_resumed_run_continues_the_same_wandb_run(logged_run, tmp_path):
    run_dir = Path(shutil.copytree(logged_run[0], tmp_path / "run"))  # steps 1-3 logged
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    again = make_loggers(_config("wandb"), run_dir, None)
    again.submit_step(_record(4))
    again.close()
    # W&B names a run's directory by its start second and id, "-1" added when that is taken
    runs = sorted(run_dir.glob(f"wandb/offline-run-*-{run_id}*"))
    assert len(runs) >= 1
    assert sorted(run_dir.glob("wandb/offline-run-*")) == runs  # no other run id
    versions = {r["policy_version"] for p in runs for r in W.history(p / f"run-{run_id}.wandb")}
    assert versions == {1, 2, 3, 4}


def test_a_failing_tracker_is_reported_once_counted_and_dropped(tmp_path, monkeypatch, caplog):
    class DiskFull:  # as a tracker's child reports it (ChildSink: tested below)
        name = "tensorboard"

        def metrics(self, step, values):
            raise OSError("disk full")

        def __getattr__(self, method):
            return lambda *args: None

    monkeypatch.setattr(T.Loggers, "_open_sinks", lambda self: [DiskFull()])
    loggers = make_loggers(_config("tensorboard"), tmp_path, None)
    with caplog.at_level(logging.WARNING, logger="asyncgrpo.consumer"):
        for step in (1, 2, 3):
            loggers.submit_step(_record(step))
        loggers.submit_completions(3, [_group(1)])
        loggers.close()
    assert loggers.failed == 1
    lines = [
        r.getMessage() for r in caplog.records if "logger tensorboard failed" in r.getMessage()
    ]
    assert len(lines) == 1
    assert "OSError: disk full" in lines[0]
    assert len(CF.read(tmp_path)) == 2  # completions.jsonl does not depend on a tracker


def test_a_stuck_tracker_never_blocks_the_learner_and_the_overflow_is_counted(
    tmp_path, monkeypatch
):
    release = threading.Event()

    class Stuck:
        name = "stuck"

        def __getattr__(self, method):
            return lambda *args: release.wait(60)

    monkeypatch.setattr(T.Loggers, "_open_sinks", lambda self: [Stuck()])
    loggers = make_loggers(_config("tensorboard"), tmp_path, None)
    for step in range(T.QUEUE_ITEMS + 10):  # returns: the queue refuses what does not fit
        loggers.submit_step(_record(step + 1))
    assert loggers.dropped >= 9
    release.set()
    loggers.close()


def test_a_tracker_whose_package_is_missing_stops_the_start_naming_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))  # fmt: skip
    with pytest.raises(C.ConfigError, match=r"pip install 'asyncgrpo\[wandb\]'"):
        make_loggers(_config("wandb"), Path("."), None)


def test_a_tracker_child_starts_at_our_priority_then_runs_niced_and_reports_failures(tmp_path):
    """W&B's wrapper (the W&B runs above go through it): the tracker is built at the priority
    the child started with, then every thread of the child and of the process the tracker
    started (W&B's service) runs niced and, on Linux, under SCHED_BATCH; a tracker that raises
    in the child, and a child that dies, each fail the next call with the reason."""
    import json
    import os
    import signal

    from consumer.loggers.child import NICE, ChildSink, TrackerFailed

    if not os.path.isdir("/proc/self/task"):
        pytest.skip("reads each thread's niceness from /proc (Linux)")
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    probe = ChildSink("probe", "tracker_probe:NicenessProbe", {})
    assert probe.niceness == max(ours, NICE)
    probe.config(str(tmp_path / "niceness.json"))
    probe.close()  # the child applied `config`, closed the probe and exited
    got = json.loads((tmp_path / "niceness.json").read_text())
    assert got["built_at"] == ours
    assert len(got["own"]) >= 2  # the child's main thread and the probe's
    assert len(got["started"]) >= 1
    for thread in got["own"] + got["started"]:
        assert thread["nice"] == probe.niceness
        if hasattr(os, "SCHED_BATCH"):  # Linux: its wake-ups never preempt training
            assert thread["policy"] == os.SCHED_BATCH

    broken = ChildSink("broken", "builtins:dict", {})  # a "tracker" with no `config`
    broken.config("x = 1")
    broken._proc.join(60)
    with pytest.raises(TrackerFailed, match="AttributeError: 'dict' object has no attribute"):
        broken.metrics(1, {})
    killed = ChildSink("killed", "builtins:dict", {})
    assert killed.pid is not None
    os.kill(killed.pid, signal.SIGKILL)
    killed._proc.join(60)
    with pytest.raises(TrackerFailed, match="exited with code -9"):
        killed.metrics(1, {})
