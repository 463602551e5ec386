"""torch.distributed for the sharded learner: the process group, rank 0's orders, rows as tensors.

What it owns: joining the process group torchrun describes (`World.from_env`, `init`), the
order channel by which rank 0 tells every other rank what to do next (`Channel`: an op code
and, for some, a short text such as a checkpoint directory), sending a batch's rows from rank
0 to every rank as tensors (`share_rows`), and gathering per-micro-batch metrics to rank 0
(`gather_metrics`). What it does not do: sharding, training, sockets (rank 0's learner owns every
socket; the other ranks never see a network byte, only tensors rank 0 built from decoded groups).

Invariants:
- Every rank issues the same collectives in the same order. Rank 0 announces each collective
  operation with one `Channel.send`; the other ranks run `Channel.receive` in a loop and do what
  it says (consumer/train/sharded.py `follow`).
- Backends: gloo on a CPU; on CUDA `cpu:gloo,cuda:nccl`, so orders and rows (CPU tensors) ride
  gloo and FSDP's collectives (CUDA tensors) ride NCCL.
- Every collective times out after `dist.timeout_s`: a rank that died or hangs makes the others
  raise `RankFailure` (a clear line, then the process exits non-zero and torchrun stops the
  rest) instead of hanging. While rank 0 waits for groups it sends `NOOP` orders every
  `timeout_s / 4` (`Channel.keepalive`) so that a quiet run is not mistaken for a dead rank.
- The order channel's latest collectives stay referenced here, those of the last order (STOP)
  for good, so that gloo's threads never free a tensor as the process exits: see `_held`.
- No pickle: rows travel as int32 / int64 / float32 / float64 tensors, texts as UTF-8 bytes.
"""

from __future__ import annotations

import collections
import ctypes
import datetime
import enum
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from common.sampling.kept_set import KeptSets
from consumer.train.batching import Row


class RankFailure(RuntimeError):
    """A collective failed or timed out: another rank died or hangs."""


@dataclass(frozen=True, slots=True)
class World:
    """This process's place among the learner's ranks (torchrun's RANK, WORLD_SIZE, LOCAL_RANK)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> World:
        env = os.environ
        return cls(
            rank=int(env.get("RANK", "0")),
            size=int(env.get("WORLD_SIZE", "1")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
        )

    @property
    def main(self) -> bool:
        return self.rank == 0


def init(world: World, *, cuda: bool, timeout_s: float) -> None:
    """Join the process group (torchrun's env:// rendezvous); on CUDA, rank r uses its local GPU."""
    if dist.is_initialized():
        return
    if cuda:
        torch.cuda.set_device(world.local_rank)
    dist.init_process_group(
        backend="cpu:gloo,cuda:nccl" if cuda else "gloo",
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def barrier() -> None:
    with failures("a barrier"):
        dist.barrier()


_failed: list[RankFailure] = []  # the first failure: every later collective would wait in vain


@contextmanager
def failures(what: str) -> Iterator[None]:
    """Turn a failed or timed-out collective into `RankFailure` naming what was under way; once
    one failed, raise at once instead of waiting `dist.timeout_s` again (shutdown tries to
    publish and checkpoint, which need every rank)."""
    if _failed:
        raise _failed[0]
    try:
        yield
    except RuntimeError as exc:
        if isinstance(exc, RankFailure) or not _lost_peer(exc):
            raise
        failure = RankFailure(
            f"rank {dist.get_rank()}: {what} failed: another learner rank died or did not answer "
            f"within dist.timeout_s ({str(exc).splitlines()[0][:200]})"
        )
        _failed.append(failure)
        raise failure from exc


def _lost_peer(exc: RuntimeError) -> bool:
    """Whether a collective failed for want of another rank (gloo raises plain RuntimeErrors:
    "Connection reset by peer", "Timed out waiting ... for recv", "Application timeout caused
    pair closure"), not for an error of its own such as running out of memory."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    return any(k in text for k in ("gloo", "pair closure", "Connection", "Timed out", "NCCL"))


class Op(enum.IntEnum):
    """What rank 0 tells the other ranks to do next (each is one collective operation)."""

    NOOP = 0  # keepalive while rank 0 waits for groups
    STEP = 1  # rows follow (share_rows); one optimizer step on them
    GATHER = 2  # the full state dict to rank 0 (publication, evaluation)
    SAVE = 3  # text = checkpoint directory: a torch.distributed.checkpoint save
    LOAD = 4  # text = checkpoint directory: restore from it
    LOGPROBS = 5  # rows follow; learner log-probs, gathered to rank 0
    STOP = 6  # the run is over


class Channel:
    """Rank 0's orders to the other ranks: `send` on rank 0, `receive` elsewhere."""

    def __init__(self, world: World, *, timeout_s: float) -> None:
        self.world = world
        self.keepalive_s = timeout_s / 4
        self._last_sent = time.monotonic()

    def send(self, op: Op, text: str = "") -> None:
        """An all-reduce, not a broadcast: it completes only when every rank has taken part,
        so even a keepalive notices a rank that hangs."""
        assert self.world.main, "only rank 0 gives orders"
        with failures(f"sending {op.name}"):
            _run(dist.all_reduce, torch.tensor([int(op)], dtype=torch.int64), op=dist.ReduceOp.MAX)
        share_text(text)
        self._last_sent = time.monotonic()
        if op is Op.STOP:
            _keep_to_the_end()

    def receive(self) -> tuple[Op, str]:
        op = torch.zeros(1, dtype=torch.int64)  # the others add 0: the MAX is rank 0's order
        with failures("waiting for rank 0's next order"):
            _run(dist.all_reduce, op, op=dist.ReduceOp.MAX)
        order, text = Op(int(op[0])), share_text(None)
        if order is Op.STOP:
            _keep_to_the_end()
        return order, text

    def keepalive(self) -> None:
        """A NOOP if nothing was sent for `timeout_s / 4` (rank 0, while it waits for groups)."""
        if time.monotonic() - self._last_sent >= self.keepalive_s:
            self.send(Op.NOOP)


# The latest collectives of the order channel (`_run`), held; after STOP, never freed.
#
# Why: gloo runs each collective on a worker thread of its own, which drops its reference to the
# collective a moment after the caller's `wait()` returned. Were that the last reference, the
# thread would free the collective's tensors, and a tensor Python knows is freed through its
# Python object, under the GIL. After the last order (STOP) a rank exits at once: if the
# interpreter is already shutting down, a thread that asks for the GIL is ended on the spot, here
# inside a C++ destructor that may not throw, and the process aborts with "terminate called
# without an active exception" (torch 2.13, CPython 3.11: about one run in nine of
# tests/integration/test_sharded_learner.py's two-rank test on a 2-core CPU, in rank 0 or 1).
# Holding the handles makes gloo's thread never their last owner, and the last orders' handles
# are kept past the interpreter's end (`_keep_to_the_end`): dropped even then, at the module's
# teardown, a thread that had not let go yet would free them. Older handles leave the deque
# tens of orders later, while the interpreter runs. Collectives outside the channel (FSDP's, a
# batch's rows) are not held: at least one whole order (STOP) follows each of them before a rank
# exits, time for gloo's thread to let go. (Waiting for the tensors' Python objects to die is not
# enough: their release gives up the GIL midway.)
_held: collections.deque[dist.Work] = collections.deque(maxlen=64)  # an order is 2-3


def _run(collective: Callable[..., dist.Work | None], *args: Any, **kwargs: Any) -> None:
    """`collective(*args, **kwargs)` to completion; its handle held in `_held` (see there)."""
    work = collective(*args, async_op=True, **kwargs)
    assert work is not None
    work.wait()
    _held.append(work)


def _keep_to_the_end() -> None:
    """The held handles are never freed: a few small tensors, once, as the process ends."""
    for work in _held:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(work))
    _held.clear()


def share_text(text: str | None) -> str:
    """Rank 0 passes a text, every other rank None; every rank returns rank 0's text (UTF-8
    bytes as a uint8 tensor, after its length)."""
    data = (text or "").encode()
    with failures("sharing a text from rank 0"):
        size = torch.tensor([len(data)], dtype=torch.int64)
        _run(dist.broadcast, size, src=0)
        buf = torch.zeros(int(size[0]), dtype=torch.uint8)
        if text is not None and data:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if len(buf):
            _run(dist.broadcast, buf, src=0)
    return text if text is not None else bytes(buf.numpy()).decode()


def share_rows(rows: list[Row] | None) -> list[Row]:
    """Rank 0 passes its rows, every other rank None; every rank returns the same rows.

    Five broadcasts: sizes [rows, ids, sampled tokens, kept ids, kept sets present, episodes],
    per-row int64 (length, prompt length, group), float64 advantages, int32 ids, float32
    behaviour log-probs; with kept sets (truncated sampling) two more: int32 per sampled token
    (its other kept ids, -1 when its kept set is unknown) and the int32 kept ids; with episodes
    one more: uint8 per completion token, 1 where it was sampled."""
    with failures("sharing a batch"):
        sizes = torch.zeros(6, dtype=torch.int64)
        if rows is not None:
            sizes[:] = torch.tensor(
                [
                    len(rows),
                    sum(len(r.ids) for r in rows),
                    sum(len(r.behavior_logp) for r in rows),
                    sum(len(r.kept.ids) for r in rows),
                    int(bool(rows) and rows[0].kept.present),
                    int(any(r.sampled is not None for r in rows)),
                ]
            )
        dist.broadcast(sizes, src=0)
        n, n_ids, n_completion, n_kept, has_kept, episodes = (int(x) for x in sizes)
        meta = torch.zeros(n, 3, dtype=torch.int64)
        adv = torch.zeros(n, dtype=torch.float64)
        ids = torch.zeros(n_ids, dtype=torch.int32)
        behavior = torch.zeros(n_completion, dtype=torch.float32)
        kept_sizes = torch.zeros(n_completion if has_kept else 0, dtype=torch.int32)
        kept_ids = torch.zeros(n_kept, dtype=torch.int32)
        sampled = torch.zeros(0, dtype=torch.uint8)
        if rows is not None:
            meta[:] = torch.tensor([[len(r.ids), r.prompt_len, r.group] for r in rows]).view(n, 3)
            adv[:] = torch.tensor([r.advantage for r in rows], dtype=torch.float64)
            if n:
                ids[:] = torch.from_numpy(np.concatenate([r.ids for r in rows]))
                behavior[:] = torch.from_numpy(np.concatenate([r.behavior_logp for r in rows]))
            if has_kept:
                kept_sizes[:] = torch.from_numpy(np.concatenate([_signed_sizes(r) for r in rows]))
                kept_ids[:] = torch.from_numpy(np.concatenate([r.kept.ids for r in rows]))
            if episodes:
                sampled = torch.from_numpy(np.concatenate([_sampled(r) for r in rows]))
        if episodes and rows is None:
            sampled = torch.zeros(int((meta[:, 0] - meta[:, 1]).sum()), dtype=torch.uint8)
        shared = (meta, adv, ids, behavior) + ((kept_sizes, kept_ids) if has_kept else ())
        for t in shared + ((sampled,) if episodes else ()):
            dist.broadcast(t, src=0)
    if rows is not None:
        return rows
    kept = (kept_sizes.numpy(), kept_ids.numpy()) if has_kept else None
    mask = sampled.numpy().astype(bool) if episodes else None
    return _rows_from(meta.numpy(), adv.numpy(), ids.numpy(), behavior.numpy(), kept, mask)


def _sampled(r: Row) -> np.ndarray:
    """uint8 per completion token of a row: 1 where the model sampled it."""
    if r.sampled is None:
        return np.ones(len(r.ids) - r.prompt_len, np.uint8)
    return r.sampled.astype(np.uint8)


def _signed_sizes(r: Row) -> np.ndarray:
    """Each completion token's number of other kept ids; -1 where its kept set is unknown."""
    out = np.diff(r.kept.offsets).astype(np.int32)
    out[r.kept.unknown] = -1
    return out


def _rows_from(
    meta: np.ndarray,
    adv: np.ndarray,
    ids: np.ndarray,
    behavior: np.ndarray,
    kept: tuple[np.ndarray, np.ndarray] | None,
    sampled: np.ndarray | None = None,
) -> list[Row]:
    out, at, at_c, at_k, at_s = [], 0, 0, 0, 0
    for (length, prompt_len, group), a in zip(meta.tolist(), adv.tolist(), strict=True):
        mask = None
        completion = length - prompt_len  # sampled tokens: all of them, or those of `mask`
        if sampled is not None:
            mask = sampled[at_s : at_s + completion]
            at_s += completion
            completion = int(mask.sum())
        sets = KeptSets()
        if kept is not None:
            signed = kept[0][at_c : at_c + completion]
            counts = np.maximum(signed, 0)
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
            unknown = np.flatnonzero(signed < 0).astype(np.int32)
            sets = KeptSets(offsets, kept[1][at_k : at_k + int(offsets[-1])], unknown)
            at_k += int(offsets[-1])
        out.append(
            Row(
                ids=ids[at : at + length],
                prompt_len=prompt_len,
                behavior_logp=behavior[at_c : at_c + completion],
                advantage=a,
                group=group,
                kept=sets,
                sampled=mask,
            )
        )
        at, at_c = at + length, at_c + completion
    return out


def gather_metrics(
    parts: list[tuple[dict[str, float], int, bool]], world: World
) -> list[tuple[dict[str, float], int]]:
    """Every rank's per-micro-batch metrics, to rank 0 (others get []).

    `parts` holds (metrics, completion tokens, real) per forward/backward pass; every rank has
    made the same number of passes, with the same metric names (the loss's options decide them),
    padding passes included (real = False, left out of the result)."""
    keys = sorted(parts[0][0]) if parts else []
    table = torch.tensor(
        [[m.get(k, float("nan")) for k in keys] + [n, float(real)] for m, n, real in parts],
        dtype=torch.float64,
    ).view(len(parts), len(keys) + 2)
    tables = [torch.zeros_like(table) for _ in range(world.size)]
    with failures("gathering step metrics"):
        dist.all_gather(tables, table)
    if not world.main:
        return []
    out = []
    for t in tables:
        for row in t.tolist():
            if row[-1]:
                out.append((dict(zip(keys, row[: len(keys)], strict=True)), int(row[-2])))
    return out
