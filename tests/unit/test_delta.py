"""Sparse snapshot deltas: bitwise-exact round trips per dtype, both encodings, and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from common.weights import delta as D
from common.weights import snapshot as snap
from consumer.snapshots.weights_buffer import HostCopier, HostWeights, table_for


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 16, generator=g) * 0.02,
        "layer.0.weight": torch.randn(16, 16, generator=g) * 0.02,
        "norm.weight": torch.ones(16),
        "tiny": torch.zeros(3),
    }


def step(state: dict[str, torch.Tensor], lr: float, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + lr * torch.randn(v.shape, generator=g).sign() for k, v in state.items()}


def file_bytes(state: dict[str, torch.Tensor], dtype: torch.dtype) -> np.ndarray:
    host = HostWeights(table_for(state, dtype), pin=False)
    HostCopier().copy(state, host)
    return np.frombuffer(bytes(host.file_bytes()), dtype=np.uint8).copy()


def make(base: np.ndarray, new: np.ndarray, tmp_path, *, name="d") -> tuple[D.Delta, object]:
    layout = D.read_layout(base)
    patches = D.diff(layout, base, new)
    delta = D.Delta(1, 2, snap.hash_bytes(base), snap.hash_bytes(new), tuple(patches))
    header, arrays = D.encode_delta(layout, delta)
    path = tmp_path / name
    D.write_delta(path, header, arrays)
    assert path.stat().st_size == D.delta_bytes(header, arrays)
    return delta, path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lr", [1e-5, 1e-2])
def test_a_delta_applied_to_its_base_gives_the_target_bit_for_bit(tmp_path, dtype, lr):
    state = weights(0)
    state["tiny"] = torch.tensor([0.0, float("nan"), 1.0])
    new_state = step(state, lr, 1)
    new_state["tiny"] = torch.tensor([-0.0, float("nan"), 1.0])  # sign of zero is a change
    base, new = file_bytes(state, dtype), file_bytes(new_state, dtype)
    _, path = make(base, new, tmp_path)
    (tmp_path / "base").write_bytes(base.tobytes())
    got = D.apply_file(tmp_path / "base", path, tmp_path / "out", base_hash=snap.hash_bytes(base))
    assert (tmp_path / "out").read_bytes() == new.tobytes()
    assert got == snap.hash_bytes(new)


def test_few_changes_are_listed_by_position_and_many_by_a_bitmask(tmp_path):
    state = weights(0)
    base = file_bytes(state, torch.bfloat16)
    touched = {k: v.clone() for k, v in state.items()}
    touched["embed.weight"][0, :3] += 1.0
    small = file_bytes(touched, torch.bfloat16)
    large = file_bytes(step(state, 1e-1, 1), torch.bfloat16)
    layout = D.read_layout(base)
    (few,) = D.diff(layout, base, small)
    assert few.name == "embed.weight"
    assert few.kind == "gap"
    assert few.positions(64 * 16).tolist() == [0, 1, 2]
    assert few.num_bytes == 3 * (1 + 2)
    many = D.diff(layout, base, large)
    assert all(p.kind == "mask" for p in many if len(p.values) > 16)
    # the mask encoding also round-trips
    _, path = make(base, large, tmp_path)
    (tmp_path / "base").write_bytes(base.tobytes())
    D.apply_file(tmp_path / "base", path, tmp_path / "out", base_hash=snap.hash_bytes(base))
    assert (tmp_path / "out").read_bytes() == large.tobytes()


def test_identical_files_give_an_empty_delta_that_still_applies(tmp_path):
    base = file_bytes(weights(0), torch.bfloat16)
    delta, path = make(base, base.copy(), tmp_path)
    assert delta.patches == ()
    (tmp_path / "base").write_bytes(base.tobytes())
    D.apply_file(tmp_path / "base", path, tmp_path / "out", base_hash=snap.hash_bytes(base))
    assert (tmp_path / "out").read_bytes() == base.tobytes()


def test_a_delta_is_refused_on_any_other_base_and_leaves_nothing(tmp_path):
    state = weights(0)
    base = file_bytes(state, torch.bfloat16)
    new = file_bytes(step(state, 1e-4, 1), torch.bfloat16)  # some elements keep their bits
    other = file_bytes(step(state, 1e-2, 2), torch.bfloat16)
    _, path = make(base, new, tmp_path)
    (tmp_path / "other").write_bytes(other.tobytes())
    with pytest.raises(D.DeltaError, match="for base"):
        D.apply_file(tmp_path / "other", path, tmp_path / "out", base_hash=snap.hash_bytes(other))
    assert not (tmp_path / "out").exists()
    # a base that claims the right hash but holds other bytes fails the result's digest
    with pytest.raises(D.DeltaError, match="result hash"):
        D.apply_file(tmp_path / "other", path, tmp_path / "out", base_hash=snap.hash_bytes(base))
    assert not (tmp_path / "out").exists()


def test_layout_changes_and_damaged_deltas_are_refused(tmp_path):
    state = weights(0)
    base = file_bytes(state, torch.bfloat16)
    wider = file_bytes({**state, "extra": torch.zeros(2)}, torch.bfloat16)
    with pytest.raises(D.DeltaError, match="layout"):
        D.diff(D.read_layout(base), base, wider)
    new = file_bytes(step(state, 1e-2, 1), torch.bfloat16)
    _, path = make(base, new, tmp_path)
    blob = np.fromfile(path, dtype=np.uint8)
    layout = D.read_layout(base)
    with pytest.raises(D.DeltaError, match="truncated"):
        D.read_delta(blob[:-3], layout)
    with pytest.raises(D.DeltaError, match="lacks"):
        D.read_delta(blob, D.read_layout(file_bytes({"x": torch.zeros(2)}, torch.bfloat16)))
    with pytest.raises(D.DeltaError, match="not a delta"):
        D.read_delta(base, layout)
    with pytest.raises(D.DeltaError):
        D.read_layout(np.zeros(4, np.uint8))


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 3000),
    dtype=st.sampled_from(["BF16", "F32", "I8", "F64"]),
    skew=st.integers(0, 7),
    data=st.data(),
)
def test_every_index_encoding_names_exactly_the_changed_elements(n, dtype, skew, data):
    """Any set of changed elements, any element size, the tensor at any byte offset (the
    word-wise comparison sees unaligned tensors and a partial last word)."""
    changed = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n)))
    size = {"BF16": 2, "F32": 4, "I8": 1, "F64": 8}[dtype]
    start = skew * size
    raw = np.zeros(start + n * size, np.uint8)
    new_raw = raw.copy()
    new = new_raw[start:].view(f"<u{size}")
    new[changed] = 1 << (8 * size - 1)  # the top bit: a sign flip
    layout = D.Layout(b"", {"t": (dtype, start, start + n * size)})
    patches = D.diff(layout, raw, new_raw)
    if not changed:
        assert patches == []
        return
    (p,) = patches
    assert p.positions(n).tolist() == changed
    assert D._consistent(p, n)
    target = raw.copy()
    D.apply(layout, target, D.Delta(0, 1, "", "", (p,)))
    assert target.tobytes() == new_raw.tobytes()


def test_long_gaps_use_zero_bytes_and_lone_changes_far_apart_use_positions():
    n = 100_000
    base = np.zeros(n, np.uint16)
    layout = D.Layout(b"", {"t": ("BF16", 0, 2 * n)})
    new = base.copy()
    new[[0, 300, 900, 1000]] = 7  # gaps 1, 300, 600, 100: 1 + 2 + 3 + 1 bytes
    (p,) = D.diff(layout, base.view(np.uint8), new.view(np.uint8))
    assert p.kind == "gap"
    assert p.index.tolist() == [1, 0, 45, 0, 0, 90, 100]
    assert p.positions(n).tolist() == [0, 300, 900, 1000]
    lone = base.copy()
    lone[n - 1] = 7  # one gap of 100,000: 393 bytes as gaps, 4 as a position
    (q,) = D.diff(layout, base.view(np.uint8), lone.view(np.uint8))
    assert q.kind == "pos"
    assert q.positions(n).tolist() == [n - 1]
