"""An hf producer's seat on its host's core board (common/host/core_board.py): the engine takes the
threads the board gives before every token step, busy while rows are in flight, and its weight
is the CPU-seconds it spends per policy version the run moves on by.

`join(cfg, run_id, producer_id, engine)` is None for other engines and off the CPU (vLLM runs on
GPUs; the fake engine computes nothing): they keep their threads. `producer.torch_threads > 0`
fixes this producer's threads (the learner and the other producers share the rest). A producer
on another host than its consumer sits on that host's board alone (or with its neighbours).
"""

from __future__ import annotations

import logging
from typing import Any

from common.config import Config
from common.host import core_board as CB
from common.host.device import resolve_device
from producer.engines.base import Engine

log = logging.getLogger("asyncgrpo.producer")


def join(cfg: Config, run_id: str, producer_id: str, engine: Engine) -> CB.Seat | None:
    """This producer's seat on the board of `run_id`, handed to its hf engine; None otherwise."""
    share = getattr(engine, "share_cores", None)
    if cfg.producer.engine != "hf" or share is None:
        return None
    if resolve_device(cfg.producer.device).type != "cpu":
        return None
    fixed = cfg.producer.torch_threads
    params = sum(p.numel() for p in engine.model.parameters())  # type: ignore[attr-defined]
    board = CB.CoreBoard(
        CB.directory_for(run_id),
        producer_id,
        weight=1.0,
        fixed=fixed,
        max_threads=CB.useful_threads(params),
    )
    seat = CB.Seat(board)
    share(seat)
    how = (
        f"fixed at {fixed} (producer.torch_threads)"
        if fixed
        else "shared with the run's learner and producers on this host by who has work "
        "(producer.torch_threads = 0)"
    )
    small = CB.small_note(params)
    log.info("torch threads: %s; %d usable cores%s", how, board.cores, small)
    return seat


def leave(seat: CB.Seat | None, engine: Engine) -> None:
    """Off the board (the engine keeps the threads it has)."""
    if seat is None:
        return
    share = getattr(engine, "share_cores", None)
    if share is not None:
        share(None)
    seat.close()


def rejoin(seat: CB.Seat | None, cfg: Config, state: Any, engine: Engine) -> CB.Seat | None:
    """Leave a previous run's seat (`producer.follow`), then join `state.run_id`'s board."""
    leave(seat, engine)
    return join(cfg, state.run_id, state.producer_id, engine)


def counters(seat: CB.Seat | None, session: Any) -> dict[str, float]:
    """The heartbeat's figures of a seated producer: its threads and CPU-s per version."""
    if seat is None or session is None:
        return {}
    used = float(getattr(session.engine, "threads_used", 0))
    return {"torch_threads": used, "cpu_s_per_version": seat.board.me.weight}
