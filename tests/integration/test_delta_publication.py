"""The publisher writes chunk hashes for every snapshot and, between anchors, a delta on the
version written before it that reproduces the snapshot bit for bit."""

from __future__ import annotations

import json

import torch

from common.weights import chunk_manifest as cm
from common.weights import delta as D
from common.weights import snapshot as snap
from consumer.snapshots.fetch_files import FetchFiles
from consumer.snapshots.publisher import Publisher


def publish(tmp_path, states, *, anchor_every, max_ratio=0.5, chunk_bytes=1000):
    published = []
    dist = FetchFiles(chunk_bytes=chunk_bytes, anchor_every=anchor_every, max_ratio=max_ratio)
    publisher = Publisher(
        tmp_path / "snaps", None, keep_last=10, on_published=published.append, fetch_files=dist
    )
    for version, state in enumerate(states):
        publisher.submit(state, version=version, step=version, dtype=torch.bfloat16)
        publisher.wait()
    publisher.close()
    return published, dist


def states(n, lr):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 32, generator=g) * 0.02
    out = []
    for _ in range(n):
        out.append({"w": w.clone(), "b": torch.ones(8)})
        w = w + lr * torch.randn(w.shape, generator=g)
    return out


def test_deltas_between_anchors_reproduce_each_snapshot_exactly(tmp_path):
    published, dist = publish(tmp_path, states(6, 1e-6), anchor_every=3)
    root = tmp_path / "snaps"
    bases = {}
    for info in published:
        bases[info.version] = cm.read_chunks(snap.snapshot_dir(root, info.version)).delta_base
    assert bases == {0: -1, 1: 0, 2: 1, 3: -1, 4: 3, 5: 4}
    assert (dist.num_anchors, dist.num_deltas) == (2, 4)
    for v in (1, 2, 4, 5):
        directory = snap.snapshot_dir(root, v)
        manifest = snap.read_manifest(directory)
        chunks = cm.read_chunks(directory)
        delta_path = directory / D.DELTA_FILE
        assert snap.hash_file(delta_path) == chunks.delta_hash
        assert delta_path.stat().st_size == chunks.files["delta"].num_bytes < manifest.num_bytes
        base = snap.snapshot_dir(root, v - 1) / snap.WEIGHTS_FILE
        out = tmp_path / f"rebuilt{v}"
        got = D.apply_file(base, delta_path, out, base_hash=snap.hash_file(base))
        assert got == manifest.hash
        assert out.read_bytes() == (directory / snap.WEIGHTS_FILE).read_bytes()
    for v in (0, 3):
        assert not (snap.snapshot_dir(root, v) / D.DELTA_FILE).exists()


def test_every_snapshot_lists_the_hash_of_each_chunk(tmp_path):
    _published, _ = publish(tmp_path, states(2, 1e-6), anchor_every=10, chunk_bytes=1000)
    directory = snap.snapshot_dir(tmp_path / "snaps", 1)
    chunks = cm.read_chunks(directory)
    assert set(chunks.files) == {"weights", "delta"}
    for name, path in (("weights", snap.WEIGHTS_FILE), ("delta", D.DELTA_FILE)):
        data = (directory / path).read_bytes()
        c = chunks.files[name]
        assert c.consistent()
        assert c.num_bytes == len(data)
        assert c.num_chunks == -(-len(data) // 1000)
        assert all(
            c.matches(i, data[o : o + s])
            for i, (o, s) in enumerate(map(c.span, range(c.num_chunks)))
        )
        first = data[: c.span(0)[1]]
        assert not c.matches(0, bytes([first[0] ^ 1]) + first[1:])  # one bit off
        assert not c.matches(0, first[:-1])  # truncated
    record = json.loads((directory / cm.CHUNKS_FILE).read_text())
    assert record["files"]["weights"]["chunk_bytes"] == 1000


def test_a_delta_that_would_not_be_much_smaller_makes_an_anchor(tmp_path):
    # lr 1e-1 moves nearly every bf16 value: the delta would be about the file's size
    published, dist = publish(tmp_path, states(3, 1e-1), anchor_every=10, max_ratio=0.5)
    root = tmp_path / "snaps"
    assert [cm.read_chunks(snap.snapshot_dir(root, i.version)).delta_base for i in published] == [
        -1,
        -1,
        -1,
    ]
    assert dist.num_deltas == 0


def test_anchor_every_zero_turns_deltas_off(tmp_path):
    _published, dist = publish(tmp_path, states(3, 1e-6), anchor_every=0)
    assert dist.num_deltas == 0
    assert cm.read_chunks(snap.snapshot_dir(tmp_path / "snaps", 2)).files.keys() == {"weights"}
