"""consumer/train/ranks.py: the order channel's latest collectives stay held (`_held`), those of
the last order (STOP) for good, so that gloo's worker thread is never the last owner of their
tensors: a thread that frees a tensor Python knows needs the GIL, and one that asks for it while
the interpreter shuts down ends the process ("terminate called without an active exception").
The two-rank run that aborted: tests/integration/test_sharded_learner.py."""

from __future__ import annotations

import collections
import gc
import weakref
from typing import Any

import pytest
import torch
import torch.distributed as dist

from consumer.train import ranks as D


class FakeWork:
    """A collective's handle: waited for, and the tensor it holds."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.waited = False

    def wait(self) -> bool:
        self.waited = True
        return True


@pytest.fixture
def collectives(monkeypatch: pytest.MonkeyPatch) -> list[FakeWork]:
    """Every all-reduce and broadcast, in order; an all-reduce gives the MAX of rank 0's STOP."""
    calls: list[FakeWork] = []

    def run(tensor: torch.Tensor, *_args: Any, async_op: bool = False, **_kwargs: Any) -> FakeWork:
        assert async_op, "a collective whose handle is dropped at once"
        calls.append(FakeWork(tensor))
        return calls[-1]

    def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> FakeWork:
        tensor.fill_(max(int(tensor[0]), int(D.Op.STOP)))
        return run(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "broadcast", run)
    monkeypatch.setattr(D, "_held", collections.deque(maxlen=8))  # as `_held`, a smaller bound
    return calls


def held() -> list[object]:
    return list(D._held)


def alive_after_dropping(works: list[FakeWork]) -> list[bool]:
    """Which of `works` something else still holds once the test drops them."""
    refs = [weakref.ref(w) for w in works]
    works.clear()
    gc.collect()
    return [r() is not None for r in refs]


def test_rank_0s_orders_are_held_and_the_last_ones_kept_for_good(
    collectives: list[FakeWork],
) -> None:
    channel = D.Channel(D.World(rank=0, size=2), timeout_s=60)
    channel.send(D.Op.SAVE, "ckpt/dir")
    assert len(collectives) == 3  # the op, the text's size, the text
    assert all(w.waited for w in collectives)
    assert held() == collectives
    assert bytes(collectives[2].tensor.numpy()) == b"ckpt/dir"
    for _ in range(3):
        channel.send(D.Op.NOOP)  # the op and the empty text's size
    assert held() == collectives[-8:]
    channel.send(D.Op.STOP)
    assert len(collectives) == 11
    assert held() == []
    assert alive_after_dropping(collectives) == [False] * 3 + [True] * 8


def test_the_other_ranks_keep_the_stop_they_received(collectives: list[FakeWork]) -> None:
    channel = D.Channel(D.World(rank=1, size=2), timeout_s=60)
    assert channel.receive() == (D.Op.STOP, "")
    assert [int(w.tensor[0]) for w in collectives] == [int(D.Op.STOP), 0]
    assert all(w.waited for w in collectives)
    assert held() == []
    assert alive_after_dropping(collectives) == [True, True]
