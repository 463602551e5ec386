"""A CPU learner takes the core board's threads at every decoder layer of a pass, forward and
backward (consumer/train/layer_threads.py), records each unit's threads, and a replay of that
record runs every unit with the same threads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common import config as C
from common import wire
from common.host.core_board import Recorded


def _group(i: int, G: int = 4) -> wire.Group:
    rng = np.random.default_rng(i)
    return wire.Group(
        lease_id=i,
        producer_id="p",
        prompt_index=i,
        behavior_version=0,
        prompt_ids=np.array([5, 6, 7], np.int32),
        completion_ids=rng.integers(2, 20, G * 3).astype(np.int32),
        completion_lens=np.full(G, 3, np.int32),
        behavior_logp=np.full(G * 3, -2.0, np.float32),
        token_versions=np.zeros(0, np.int32),
        rewards=np.array([1, 0, 1, 0], np.float32),
        finish_reasons=("length",) * G,
        temperature=1.0,
    )


class Alternating:
    """A board that changes its mind at every unit: 1, 2, 1, 2, ... threads."""

    per_layer = True

    def __init__(self) -> None:
        self.given: list[int] = []
        self.steps = 0

    def work(self) -> int:
        self.given.append(1 + len(self.given) % 2)
        return self.given[-1]

    def describe(self) -> str:
        return "alternating"

    def finished_step(self) -> None:
        self.steps += 1


@pytest.fixture
def trainer(tiny_model_dir):
    from consumer.train.trainer import DeviceTrainer

    cfg = C.override(C.Config(), {"model.device": "cpu", "sampling.group_size": 4})
    before = torch.get_num_threads()
    yield DeviceTrainer(cfg, tiny_model_dir)
    torch.set_num_threads(before)


def _seen_in_layers(trainer) -> list[int]:
    """torch threads at each decoder layer's forward and backward, as the layer runs."""
    from consumer.train.layer_threads import decoder_layers

    seen: list[int] = []
    for layer in decoder_layers(trainer.model):
        layer.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
        layer.register_full_backward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    return seen


def test_every_decoder_layer_takes_the_boards_threads_forward_and_backward(trainer):
    from consumer.train.layer_threads import decoder_layers

    layers = len(decoder_layers(trainer.model))
    assert layers == 2
    board = Alternating()
    trainer.share_cores(board)
    seen = _seen_in_layers(trainer)
    out = trainer.step([_group(0), _group(1)])
    # one pass: its start, then each layer's forward, then each layer's backward
    assert len(board.given) == 1 + 2 * layers
    assert out["pass_threads"] == board.given
    assert out["learner_threads"] == pytest.approx(np.mean(board.given))
    # forward layers in order, then backward from the last layer: the layer ran with what the
    # board gave right before it
    assert sorted(seen) == sorted(board.given[1:])
    assert seen[:layers] == board.given[1 : 1 + layers]
    assert board.steps == 1


def test_generation_on_the_learners_model_takes_no_threads_from_the_board(trainer):
    board = Alternating()
    trainer.share_cores(board)
    with torch.no_grad():
        trainer.eval_model()(torch.tensor([[5, 6, 7]]))
    assert board.given == []


def test_without_a_board_the_layers_keep_the_configured_threads(trainer):
    out = trainer.step([_group(0), _group(1)])
    assert out["pass_threads"] == [torch.get_num_threads()]


def test_a_replay_runs_every_unit_with_the_recorded_threads(trainer, tiny_model_dir):
    from consumer.train.trainer import DeviceTrainer

    board = Alternating()
    trainer.share_cores(board)
    seen_first = _seen_in_layers(trainer)
    first = trainer.step([_group(0), _group(1)])
    again = DeviceTrainer(trainer.cfg, tiny_model_dir)
    again.share_cores(Recorded(tuple(first["pass_threads"])))
    seen_again = _seen_in_layers(again)
    second = again.step([_group(0), _group(1)])
    assert second["pass_threads"] == first["pass_threads"]
    assert seen_again == seen_first
    assert second["loss"] == first["loss"]


def test_a_recording_from_before_the_layers_took_threads_replays_pass_by_pass(trainer):
    """An older recording has one entry per pass: its layers take none, the pass's hold."""
    trainer.share_cores(Recorded((2,), per_layer=False))
    seen = _seen_in_layers(trainer)
    out = trainer.step([_group(0), _group(1)])
    assert out["pass_threads"] == [2]
    assert seen == [2] * len(seen)
    assert trainer.threads_per_layer is False


def test_a_step_entry_says_whether_its_threads_have_the_layers():
    from consumer.stream.records import StepEntry

    new = StepEntry(version=1, kept=(1,), threads=(1, 2, 2), layer_threads=True)
    old = StepEntry(version=1, kept=(1,), threads=(1,))
    assert StepEntry.from_bytes(new.to_bytes()) == new
    assert b"layer_threads" not in old.to_bytes()  # older recordings' bytes are unchanged
    assert StepEntry.from_bytes(old.to_bytes()).layer_threads is False


def test_a_member_that_one_thread_serves_takes_them_per_pass_only(tmp_path):
    from common.host import core_board as CB

    small = CB.Seat(CB.CoreBoard(tmp_path, "learner", weight=1.0, max_threads=1, cores=2))
    large = CB.Seat(CB.CoreBoard(tmp_path, "p1", weight=1.0, cores=2))
    assert small.per_layer is False
    assert large.per_layer is True
