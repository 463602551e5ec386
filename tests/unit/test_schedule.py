"""The learning-rate schedule (consumer/train/schedule.py): the curve of each `train.lr_schedule`,
its config checks, and on a real tiny model the lr each step reports and a resume from a
checkpoint that continues the curve (and the weights) exactly."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from sharded_steps import batch

from common import config as C
from common.files import run_files as RF
from consumer.train import checkpoint
from consumer.train.schedule import lr_factor
from consumer.train.trainer import DeviceTrainer


def _curve(schedule: str, *, warmup: int = 0, total: int = 6, floor: float = 0.0) -> list[float]:
    return [
        lr_factor(u, schedule=schedule, warmup=warmup, total=total, min_ratio=floor)  # type: ignore[arg-type]
        for u in range(total + 2)
    ]


def test_warm_up_climbs_linearly_to_the_peak_then_constant_stays():
    assert _curve("constant", warmup=4) == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert _curve("constant") == [1.0] * 8


def test_linear_and_cosine_decay_from_the_peak_to_the_floor_at_the_last_update_and_stay():
    linear = _curve("linear", warmup=2, total=6, floor=0.2)
    assert linear[:2] == [0.5, 1.0]
    # after warm-up: updates 2..5 go 1 -> 0.2 in 3 equal steps, then the floor
    assert linear[2:] == pytest.approx([1.0, 1 - 0.8 / 3, 1 - 1.6 / 3, 0.2, 0.2, 0.2])
    cosine = _curve("cosine", total=5)
    quarter = (1 + math.cos(math.pi / 4)) / 2
    assert cosine == pytest.approx([1.0, quarter, 0.5, 1 - quarter, 0.0, 0.0, 0.0])
    assert _curve("cosine", total=5, floor=1.0) == [1.0] * 7


def test_a_decaying_schedule_needs_a_run_length():
    cfg = C.override(C.Config(), {"train.lr_schedule": "cosine", "run.steps": 0})
    assert [p for p in C.problems(cfg) if "train.lr_schedule = 'cosine' decays" in p]
    assert not C.problems(C.override(cfg, {"train.lr_schedule": "constant"}))


def test_an_unknown_schedule_is_refused_with_the_choices():
    with pytest.raises(C.ConfigError, match="cosine"):
        C.override(C.Config(), {"train.lr_schedule": "exponential"})


def _config(model_dir: Path) -> C.Config:
    return C.override(C.Config(), {
        "model.path": str(model_dir), "model.device": "cpu", "train.lr": 1e-3,
        "train.lr_schedule": "cosine", "train.warmup_steps": 2, "train.lr_min_ratio": 0.1,
        "run.steps": 6, "train.prompts_per_step": 3, "sampling.group_size": 4,
    })  # fmt: skip


def test_each_step_reports_its_lr_and_a_resumed_trainer_continues_the_curve(
    tiny_model_dir: Path, tmp_path: Path
):
    cfg = _config(tiny_model_dir)
    torch.manual_seed(0)
    straight = DeviceTrainer(cfg, tiny_model_dir)
    lrs = [straight.step(batch(s, vocab=straight.vocab_size))["lr"] for s in range(1, 4)]
    checkpoint.save(tmp_path, trainer=straight, version=3, book_state=RF.BookState(book={}))
    lrs += [straight.step(batch(s, vocab=straight.vocab_size))["lr"] for s in range(4, 7)]
    expected = [1e-3 * lr_factor(s, schedule="cosine", warmup=2, total=6, min_ratio=0.1)
                for s in range(6)]  # fmt: skip
    assert lrs == pytest.approx(expected, rel=1e-12)
    assert len(set(lrs)) == 5  # the peak twice (end of warm-up, start of decay), else distinct

    torch.manual_seed(1)  # another seed: everything that matters comes from the checkpoint
    resumed = DeviceTrainer(cfg, tiny_model_dir)
    assert checkpoint.load(tmp_path, trainer=resumed)[0] == 3
    assert [resumed.step(batch(s, vocab=resumed.vocab_size))["lr"] for s in range(4, 7)] == lrs[3:]
    theirs, ours = straight.weights(), resumed.weights()
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)
