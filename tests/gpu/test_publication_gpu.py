"""Weight publication from CUDA weights: pinned buffers, the side stream, the fence.

The copy is only enqueued on a side stream; these tests check what makes that safe: the copy
sees every write the compute stream enqueued before `submit` (the side stream waits for it),
and an update enqueued after `Fence.hold_stream` (what the optimizer step does) cannot leak
into the snapshot. Run on a CUDA machine: `pytest -m gpu tests/gpu/test_publication_gpu.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from common.wire import SnapshotInfo
from consumer.snapshots.publisher import Publisher

pytestmark = pytest.mark.gpu


def busy(x: torch.Tensor, rounds: int = 20) -> None:
    """Keep the current stream busy for a while (so a missing wait would show as a race)."""
    for _ in range(rounds):
        x = x @ x
        x = x / x.norm()


def test_the_copy_sees_prior_writes_and_hides_later_ones(tmp_path: Path) -> None:
    published: list[SnapshotInfo] = []
    publisher = Publisher(tmp_path / "snaps", None, keep_last=3, on_published=published.append)
    w = torch.zeros(4096, 1024, device="cuda")
    scratch = torch.randn(2048, 2048, device="cuda")
    for version in range(1, 4):
        busy(scratch)
        w.fill_(float(version))  # enqueued on the compute stream before submit
        fence = publisher.submit({"w": w}, version=version, step=version, dtype=torch.bfloat16)
        fence.hold_stream()
        w.fill_(-1.0)  # "the optimizer step": must wait for the copy
        publisher.wait()
    publisher.close()
    assert [p.version for p in published] == [1, 2, 3]
    for info in published:
        got = load_file(info.path)["w"]
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, torch.full_like(got, float(info.version))), info.version


def test_submit_returns_before_the_copy_completes_and_buffers_are_pinned(tmp_path: Path) -> None:
    publisher = Publisher(tmp_path / "snaps", None, keep_last=3, on_published=lambda info: None)
    scratch = torch.randn(4096, 4096, device="cuda")
    w = torch.randn(8192, 4096, device="cuda")
    fence = publisher.submit({"w": w}, version=1, step=1, dtype=torch.bfloat16)
    fence.wait()
    busy(scratch, rounds=50)  # the copy queues behind this work
    fence = publisher.submit({"w": w}, version=2, step=2, dtype=torch.bfloat16)
    assert not fence.done()  # enqueued, not waited for
    fence.wait()
    assert fence.done()
    publisher.close()
    assert all(host.data.is_pinned() for host in publisher._hosts)
