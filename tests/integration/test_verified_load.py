"""The bytes a producer loads are the bytes it verified (not whatever the path names later).

The consumer's snapshot `v<version>` may name other bytes by the time the engine reads it: a
resumed run republishes that version from its own timeline, and pruning removes it. Here the
directory is replaced at the exact point between verification and load (the producer's `_fetch`
has returned, the engine has not loaded yet): the engine still loads what was verified. The
fallback for another filesystem (a copy hashed as it is written) is checked the same way.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import zmq.asyncio
from safetensors.torch import load_file
from tiny_models import write_snapshot

from common import config as C
from common import wire
from common.errors import SnapshotError
from common.weights import snapshot as snap
from producer.engines.hf import HFEngine
from producer.worker import Producer


def publish(root: Path, state: dict[str, torch.Tensor], *, version: int, seed: int) -> Path:
    """A snapshot directory as the publisher leaves it (weights + manifest, renamed in)."""
    tmp = write_snapshot(state, root / f"tmp-{seed}", noise=0.05, seed=seed)
    data = (tmp / snap.WEIGHTS_FILE).read_bytes()
    manifest = snap.Manifest(version, version, snap.hash_bytes(data), len(data), "float32", 0.0,
                             snap.host_id())  # fmt: skip
    (tmp / snap.MANIFEST_FILE).write_text(json.dumps(dataclasses.asdict(manifest)))
    final = snap.snapshot_dir(root, version)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def info_of(directory: Path, version: int) -> wire.SnapshotInfo:
    m = snap.read_manifest(directory)
    return wire.SnapshotInfo(version, m.num_bytes, m.hash, str(directory / snap.WEIGHTS_FILE))


@pytest.mark.parametrize("trust", [True, False], ids=["manifest_trusted", "hashed"])
@pytest.mark.parametrize("same_filesystem", [True, False], ids=["linked", "copied"])
async def test_the_engine_loads_the_verified_bytes_after_the_path_changed(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch, trust: bool, same_filesystem: bool
):
    if not same_filesystem:

        def cross_device(*_args, **_kwargs):
            raise OSError(errno.EXDEV, "Invalid cross-device link")

        monkeypatch.setattr(os, "link", cross_device)
    engine = HFEngine(tiny_model_dir, device="cpu", seed=0)
    base = engine.model.state_dict()  # tied weights share storage: written once
    root = tmp_path / "snapshots"
    verified = publish(root, base, version=7, seed=1)
    verified_state = load_file(verified / snap.WEIGHTS_FILE)
    cfg = C.override(C.Config(), {"producer.trust_local_hash": trust, "producer.engine": "hf"})
    ctx = zmq.asyncio.Context()
    producer = Producer(cfg, ctx)
    try:
        directory = await producer.weights.fetch(info_of(verified, 7))
        # the exact point: verified, not loaded yet; the run resumes and republishes v7
        publish(root, base, version=7, seed=2)
        await engine.load_weights(directory, 7)
        replaced = load_file(snap.snapshot_dir(root, 7) / snap.WEIGHTS_FILE)
        got = engine.model.state_dict()
        for name, tensor in verified_state.items():
            assert torch.equal(got[name], tensor), name
        name = "model.embed_tokens.weight"
        assert not torch.equal(replaced[name], verified_state[name])
        counted = producer.state.counters
        assert counted.get("snapshots_local_trusted" if trust else "snapshots_local") == 1
    finally:
        await engine.close()
        await producer.close()
        ctx.term()


def test_a_pinned_file_that_disagrees_is_refused_and_nothing_is_left(tmp_path: Path, monkeypatch):
    data = os.urandom(1 << 16)
    source = tmp_path / "v000001" / snap.WEIGHTS_FILE
    source.parent.mkdir()
    source.write_bytes(data)
    good = {"expected_hash": snap.hash_bytes(data), "expected_bytes": len(data)}
    into = tmp_path / "pin"
    pinned, _ = snap.pin_local(source, into, **good, trust_writer=False)
    assert os.stat(pinned).st_ino == os.stat(source).st_ino  # the same file, not a copy
    with pytest.raises(SnapshotError, match="hash"):
        snap.pin_local(source, into, expected_hash="0" * 64, expected_bytes=len(data),
                       trust_writer=False)  # fmt: skip
    assert not (into / snap.WEIGHTS_FILE).exists()

    def cross_device(*_args, **_kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    pinned, _ = snap.pin_local(source, into, **good, trust_writer=False)
    assert os.stat(pinned).st_ino != os.stat(source).st_ino
    assert pinned.read_bytes() == data
    with pytest.raises(SnapshotError, match="bytes"):
        snap.pin_local(source, into, expected_hash=good["expected_hash"],
                       expected_bytes=len(data) + 1, trust_writer=True)  # fmt: skip
    assert not (into / snap.WEIGHTS_FILE).exists()
