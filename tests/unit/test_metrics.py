"""common/files/metrics.py: one typed record per optimizer step, written by the learner and read
back by the dashboard, the report and the stress sweep."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from common import config as C
from common import wire
from common.files import metrics as M
from consumer.train import loss as L

LEARNER = {
    "step": 3, "time_s": 1.5, "unix_time": 1.7e9, "step_wall_s": 0.5, "reward_mean": 0.25,
    "reward_std": 0.4, "frac_reward_zero_std": 0.0, "staleness_mean": 0.5, "staleness_max": 1,
    "staleness_hist": {"0": 2, "1": 2}, "tokens_per_s": 100.0, "learner_idle_frac": 0.2,
    "wait_s": 0.1, "publish_submit_s": 0.01, "snapshot_write_s": 0.02, "snapshots_superseded": 0,
    "num_completion_tokens": 50, "groups_trained": 12, "groups_dropped_stale": 1,
    "groups_dropped_zero_variance": 2, "groups_rejected_invalid": 0, "groups_expired": 0,
    "leases_open": 4, "rejected_messages": 0, "producers": {"p1": {"version": 2, "state": "idle"}},
    "producer_counters": {"p1": {"busy_s": 1.0}},
}  # fmt: skip
FIELDS = {f.name for f in dataclasses.fields(M.StepRecord)}


def _group(i: int, G: int = 4) -> wire.Group:
    rng = np.random.default_rng(i)
    return wire.Group(
        lease_id=i, producer_id="p", prompt_index=i, behavior_version=0,
        prompt_ids=np.array([5, 6, 7], np.int32),
        completion_ids=rng.integers(2, 20, G * 3).astype(np.int32),
        completion_lens=np.full(G, 3, np.int32), behavior_logp=np.full(G * 3, -2.0, np.float32),
        token_versions=np.zeros(0, np.int32), rewards=np.array([1, 0, 1, 0], np.float32),
        finish_reasons=("length",) * G, temperature=1.0,
    )  # fmt: skip


def _groups(n: int = 2) -> list[wire.Group]:
    return [_group(i) for i in range(n)]


def test_a_record_goes_to_its_line_and_back_leaving_out_what_was_not_measured(tmp_path):
    record = M.StepRecord(**LEARNER, tis_ess=0.97, heldout_accuracy=0.5)
    line = record.to_json()
    assert "tis_ess" in line
    assert "grad_norm" not in line  # not measured: not written (as before: no key, no null)
    writer = M.JsonlWriter(tmp_path / "metrics.jsonl")
    writer.write(record)
    writer.close()
    text = (tmp_path / "metrics.jsonl").read_text()
    assert list(json.loads(text)) == sorted(line)  # keys sorted, as every line always was
    assert M.read_steps(tmp_path / "metrics.jsonl") == [record]
    assert M.read_steps(tmp_path / "nothing.jsonl") == []


def test_the_writer_refuses_a_name_the_record_does_not_define():
    with pytest.raises(TypeError, match="tis_effective"):
        M.StepRecord(**LEARNER, tis_effective=0.9)
    with pytest.raises(TypeError, match="reward_mean"):
        M.StepRecord(**{k: v for k, v in LEARNER.items() if k != "reward_mean"})


def test_a_reader_names_a_missing_field_and_ignores_names_it_does_not_know():
    with pytest.raises(ValueError, match="lacks reward_mean"):
        M.StepRecord.from_json({k: v for k, v in LEARNER.items() if k != "reward_mean"})
    assert M.StepRecord.from_json({**LEARNER, "from_a_newer_writer": 1}) == M.StepRecord(**LEARNER)


def test_every_metric_the_loss_and_both_trainers_report_has_a_field(tiny_model_dir):
    from consumer.train.simulated import SimulatedTrainer
    from consumer.train.trainer import DeviceTrainer

    assert set(L.METRIC_KEYS) <= FIELDS
    cfg = C.override(C.Config(), {"model.device": "cpu", "sampling.group_size": 4})
    real = DeviceTrainer(cfg, tiny_model_dir).step(_groups())
    assert "tis_ess" in real
    M.StepRecord(**LEARNER, **real)
    fake = SimulatedTrainer(C.override(cfg, {"train.simulate_step_s": 0.001})).step(_groups())
    M.StepRecord(**LEARNER, **fake)
