"""common/weights/snapshot.py's one rule for "does this snapshot fit the model" (hf engine, vllm
engine and evaluator alike), and tensor shapes read from safetensors headers."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

from common.errors import SnapshotError
from common.weights.snapshot import check_fits, tensor_shapes

MODEL = {"embed": (10, 4), "head": (10, 4), "norm": (4,)}
TIED = {"embed": 1, "head": 1, "norm": 2}  # head shares embed's storage


def test_shapes_come_from_the_header_of_a_file_or_of_every_file_in_a_directory(tmp_path):
    save_file({"a": np.zeros((2, 3), np.float32)}, str(tmp_path / "one.safetensors"))
    save_file({"b": np.zeros(5, np.float16)}, str(tmp_path / "two.safetensors"))
    assert tensor_shapes(tmp_path / "one.safetensors") == {"a": (2, 3)}
    assert tensor_shapes(tmp_path) == {"a": (2, 3), "b": (5,)}
    assert tensor_shapes(tmp_path / "nothing-here") == {}


def test_an_unreadable_header_is_a_snapshot_error(tmp_path):
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    with pytest.raises(SnapshotError, match="cannot read safetensors header"):
        tensor_shapes(bad)


def test_a_tied_tensor_may_be_stored_once():
    check_fits({"embed": (10, 4), "norm": (4,)}, MODEL, "s", storage=TIED)
    check_fits({"head": (10, 4), "norm": (4,)}, MODEL, "s", storage=TIED)
    check_fits(MODEL, MODEL, "s", storage=TIED)


@pytest.mark.parametrize(
    ("file", "storage", "optional", "message"),
    [
        ({"norm": (4,)}, TIED, (), "missing: embed, head"),  # both tied names absent
        ({"embed": (10, 4), "norm": (4,)}, None, (), "missing: head"),  # untied
        ({**MODEL, "extra": (1,)}, TIED, (), "unexpected: extra"),
        ({**MODEL, "norm": (5,)}, TIED, (), r"wrong shape: norm \[5\] != \[4\]"),
        ({}, TIED, (), r"no tensors \(no \*\.safetensors file"),
    ],
)
def test_what_does_not_fit_is_named(file, storage, optional, message):
    with pytest.raises(SnapshotError, match=rf"snapshot s does not fit the model \(.*{message}"):
        check_fits(file, MODEL, "s", storage=storage, optional=optional)


def test_optional_names_may_be_absent_on_either_side():
    base = {"embed": (10, 4), "norm": (4,)}
    check_fits({**base, "head": (10, 4)}, base, "s", optional=("head",))
    check_fits(base, {**base, "head": (10, 4)}, "s", optional=("head",))


def test_the_refusal_lists_three_names_per_problem_then_an_ellipsis():
    model = {f"w{i}": (2,) for i in range(7)}
    with pytest.raises(SnapshotError) as info:
        check_fits({"w0": (3,), "x": (1,)}, model, "s")  # 6 missing, 1 unexpected, 1 wrong
    assert str(info.value) == (
        "snapshot s does not fit the model (missing: w1, w2, w3 ...; unexpected: x; "
        "wrong shape: w0 [3] != [2])"
    )
    with pytest.raises(SnapshotError) as info:
        check_fits({"w0": (2,), "w1": (2,), "w2": (2,), "w3": (2,)}, model, "s")  # 3 missing
    assert str(info.value) == "snapshot s does not fit the model (missing: w4, w5, w6)"
    with pytest.raises(SnapshotError) as info:
        check_fits({"w0": (2,), "w1": (2,), "w2": (2,)}, model, "s")  # 4 missing
    assert str(info.value) == "snapshot s does not fit the model (missing: w3, w4, w5 ...)"


def test_an_empty_snapshot_says_so_first():
    with pytest.raises(SnapshotError) as info:
        check_fits({}, {"w": (2,)}, "s")
    assert str(info.value) == (
        "snapshot s does not fit the model (no tensors (no *.safetensors file, or an empty one); "
        "missing: w)"
    )
