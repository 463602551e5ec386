"""The learner's seat on its host's core board (common/host/core_board.py): busy while it trains,
idle while it waits for groups, its weight the CPU-seconds a step takes; on a CPU the trainer
takes its threads again before every decoder layer (consumer/train/layer_threads.py).

`join(cfg, run_id, trainer)` is None where the learner does not compute on this host's cores
(a GPU, ranks under torchrun, the simulated trainer): it then keeps the threads it was
configured with. Otherwise the trainer asks the seat for its threads before each
forward/backward pass (`Trainer.share_cores`); `model.torch_threads > 0` fixes them (the
producers share the rest); every metrics line says what the learner used (`learner_threads`)
and how the host's cores stood at the step's start (`cores`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from common.config import Config
from common.host import core_board as CB
from common.host.device import resolve_device
from consumer.train.protocol import Trainer

log = logging.getLogger("asyncgrpo.consumer")
NAME = "learner"


def join(cfg: Config, run_id: str, trainer: Trainer) -> CB.Seat | None:
    """The learner's seat on the board of `run_id`, handed to `trainer`; None off this CPU."""
    if cfg.train.simulate_step_s or trainer.world_size > 1:
        return None
    if resolve_device(cfg.model.device).type != "cpu":
        return None
    params = sum(t.numel() for t in trainer.weights().values())
    board = CB.CoreBoard(
        CB.directory_for(run_id),
        NAME,
        weight=1.0,
        fixed=cfg.model.torch_threads,
        max_threads=CB.useful_threads(params),
    )
    seat = CB.Seat(board)
    trainer.share_cores(seat)
    how = (
        f"fixed at {cfg.model.torch_threads} (model.torch_threads)"
        if cfg.model.torch_threads
        else "shared with the run's producers on this host by who has work (model.torch_threads"
        " = 0)"
    )
    small = CB.small_note(params)
    log.info("learner torch threads: %s; %d usable cores%s", how, board.cores, small)
    return seat


@contextlib.contextmanager
def busy(seat: CB.Seat | None) -> Iterator[None]:
    """Other work on the learner's thread (the periodic held-out evaluation) with the seat's
    share of the cores, busy meanwhile."""
    if seat is None:
        yield
        return
    import torch

    torch.set_num_threads(seat.work())
    try:
        yield
    finally:
        seat.rest()
