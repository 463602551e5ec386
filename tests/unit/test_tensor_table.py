"""The safetensors layout of a tensor table: header, byte ranges, alignment, flat dtype groups."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load

from common.weights.tensor_table import DTYPE_SIZES, TensorSpec, plan

NUMPY = {
    "F64": np.float64, "I64": np.int64, "F32": np.float32, "I32": np.int32, "F16": np.float16,
    "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}  # fmt: skip


def file_of(specs: list[TensorSpec], values: dict[str, np.ndarray]) -> bytes:
    """The file bytes a writer produces: the table's header, each tensor at its slot."""
    table = plan(specs, metadata={"format": "pt"})
    buf = bytearray(table.num_bytes)
    buf[: table.data_start] = table.header
    for s in table.slots:
        buf[s.begin : s.end] = values[s.spec.name].tobytes()
    return bytes(buf)


def test_header_says_where_every_tensor_is_and_data_starts_aligned():
    specs = [
        TensorSpec("norm", "BF16", (5,)),
        TensorSpec("ids", "I64", (3,)),
        TensorSpec("w", "F32", (2, 3)),
        TensorSpec("emb", "BF16", (4, 2)),
    ]
    table = plan(specs, metadata={"format": "pt"})
    (n,) = struct.unpack("<Q", table.header[:8])
    assert table.data_start == 8 + n
    assert table.data_start % 8 == 0
    header = json.loads(table.header[8:])
    assert header["__metadata__"] == {"format": "pt"}
    # larger elements first; within a dtype the given order
    assert [s.spec.name for s in table.slots] == ["ids", "w", "norm", "emb"]
    assert header["ids"] == {"dtype": "I64", "shape": [3], "data_offsets": [0, 24]}
    assert header["w"]["data_offsets"] == [24, 48]
    assert header["norm"]["data_offsets"] == [48, 58]
    assert header["emb"]["data_offsets"] == [58, 74]
    assert table.num_bytes == table.data_start + 74
    assert table.groups == {
        "I64": (table.data_start, table.data_start + 24),
        "F32": (table.data_start + 24, table.data_start + 48),
        "BF16": (table.data_start + 48, table.data_start + 74),
    }
    assert table.slot("w").begin == table.data_start + 24


@pytest.mark.parametrize(
    ("specs", "match"),
    [
        ([TensorSpec("a", "F32", (1,)), TensorSpec("a", "F32", (2,))], "unique"),
        ([TensorSpec("__metadata__", "F32", (1,))], "cannot lay out"),
        ([TensorSpec("a", "F33", (1,))], "cannot lay out"),
        ([TensorSpec("a", "F32", (-1, 2))], "cannot lay out"),
    ],
)
def test_impossible_tables_are_refused(specs, match):
    with pytest.raises(ValueError, match=match):
        plan(specs)


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[TensorSpec], dict[str, np.ndarray]]:
    n = draw(st.integers(1, 8))
    names = draw(st.lists(st.text("abc.xyz_0123", min_size=1, max_size=12), min_size=n,
                          max_size=n, unique=True))  # fmt: skip
    specs, values = [], {}
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    for name in names:
        code = draw(st.sampled_from(sorted(NUMPY)))
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        specs.append(TensorSpec(name, code, shape))
        values[name] = (rng.integers(0, 2, shape) if code == "BOOL" else rng.normal(size=shape) * 9
                        ).astype(NUMPY[code])  # fmt: skip
    return specs, values


@settings(max_examples=60, deadline=None)
@given(tables())
def test_any_table_gives_a_file_safetensors_reads_back_exactly(table_and_values):
    specs, values = table_and_values
    table = plan(specs)
    end = table.data_start
    for s in table.slots:  # contiguous, aligned, sized
        assert s.begin == end
        assert (s.begin - table.data_start) % DTYPE_SIZES[s.spec.dtype] == 0
        assert s.end - s.begin == s.spec.num_bytes
        end = s.end
    assert end == table.num_bytes
    loaded = load(file_of(specs, values))
    assert loaded.keys() == values.keys()
    for name, value in values.items():
        assert loaded[name].dtype == value.dtype
        np.testing.assert_array_equal(loaded[name], value)
