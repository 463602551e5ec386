"""The buffers behind weight publication: a copy never waits, a slow writer is superseded, a
second buffer only when a copy would wait; and the CPU copy into a buffer, in a few large parts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.snapshots.publisher import Buffers, Job
from consumer.snapshots.weights_buffer import Fence, HostCopier, HostWeights, _split, table_for


def job(version: int) -> Job:
    return Job(version, version, "bfloat16", Fence())


def publish(b: Buffers, version: int) -> tuple[int, int | None]:
    index, superseded = b.claim()
    b.fill(index, job(version))
    return index, None if superseded is None else superseded.version


def test_a_third_version_supersedes_the_one_waiting_while_the_writer_is_busy():
    b = Buffers(2)
    assert publish(b, 1) == (0, None)
    taken = b.take()
    assert taken is not None
    assert (taken[0], taken[1].version) == (0, 1)  # the writer works on buffer 0
    assert publish(b, 2) == (1, None)  # the other buffer is free
    assert publish(b, 3) == (1, 2)  # v2 never reaches the disk
    assert publish(b, 4) == (1, 3)
    assert b.take() is None  # one writer: nothing more until it is done
    b.release(0)
    taken = b.take()
    assert taken is not None
    assert (taken[0], taken[1].version) == (1, 4)  # the newest is written next
    assert publish(b, 5) == (0, None)
    b.release(1)
    assert not b.idle()
    taken = b.take()
    assert taken is not None
    assert taken[1].version == 5
    b.release(0)
    assert b.idle()


def test_two_waiting_versions_are_written_oldest_first_and_the_oldest_is_superseded():
    b = Buffers(2)
    publish(b, 1)
    publish(b, 2)  # the writer has not started yet: both buffers wait
    assert publish(b, 3) == (0, 1)
    taken = b.take()
    assert taken is not None
    assert taken[1].version == 2
    b.release(taken[0])
    taken = b.take()
    assert taken is not None
    assert taken[1].version == 3


def test_a_failed_copy_gives_its_buffer_back():
    b = Buffers(2)
    index, _ = b.claim()
    b.abandon(index)
    assert b.idle()
    assert sorted(b.free) == [0]
    assert b.claim() == (0, None)  # taken again, not a new one


def test_a_writer_that_keeps_up_needs_one_buffer_and_a_second_is_made_when_a_copy_would_wait():
    b = Buffers(2)
    for version in range(1, 6):  # written before the next copy: always buffer 0
        assert publish(b, version) == (0, None)
        taken = b.take()
        assert taken is not None
        b.release(taken[0])
    assert b.count == 1
    publish(b, 6)
    assert b.take() is not None  # the writer holds buffer 0
    assert publish(b, 7) == (1, None)  # a second buffer rather than a wait
    assert b.count == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["publish", "take", "release"]), max_size=60), st.integers(2, 4))
def test_any_interleaving_keeps_order_and_always_writes_the_newest(ops, count):
    b = Buffers(count)
    version, written, superseded = 0, [], []
    writing: int | None = None
    for op in ops:
        if op == "publish":
            version += 1
            _, gone = publish(b, version)  # never waits, whatever the writer does
            if gone is not None:
                superseded.append(gone)
        elif op == "take" and writing is None and (taken := b.take()) is not None:
            writing = taken[0]
            written.append(taken[1].version)
        elif op == "release" and writing is not None:
            b.release(writing)
            writing = None
        held = set(b.free) | set(b.pending) | {b.writing} - {None}
        assert len(b.free) + len(b.pending) + (b.writing is not None) == b.count == len(held)
        assert b.count <= count
    if writing is not None:
        b.release(writing)
    while (taken := b.take()) is not None:  # drain
        written.append(taken[1].version)
        b.release(taken[0])
    assert b.idle()
    assert written == sorted(written)  # snapshots appear in version order
    assert sorted(written + superseded) == list(range(1, version + 1))  # each exactly once
    assert not version or written[-1] == version  # the newest is never superseded


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_cpu_copy_in_parts_fills_every_tensor_and_restores_the_thread_count(threads):
    state = {f"t{i}": torch.randn(i * 97 + 1, 3) for i in range(12)}
    state["ids"] = torch.arange(7)
    host = HostWeights(table_for(state, torch.bfloat16), pin=False)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        HostCopier().copy(state, host).wait()
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    for name, tensor in state.items():
        expected = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert torch.equal(host.views[name], expected), name


@pytest.mark.parametrize("parts", [1, 2, 3, 8, 40])
def test_the_split_keeps_order_covers_everything_and_balances_bytes(parts):
    items = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([5, 100, 3, 50, 50, 7, 90, 1])]
    runs = _split(items, parts)
    assert [name for run in runs for name, _ in run] == [name for name, _ in items]
    assert all(runs)
    assert len(runs) <= min(parts, len(items))
    if parts == 2:
        sizes = [sum(t.numel() for _, t in run) for run in runs]
        assert max(sizes) <= 0.6 * sum(sizes)
