"""Where every tensor's bytes live in a safetensors file, fixed once for a table of tensors.

A safetensors file is an 8-byte little-endian length N, N bytes of JSON header, then the data
section. The header maps every tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}`
(offsets relative to the data section) and `__metadata__` to a map of strings. Because a policy's
names, dtypes and shapes never change during a run, `plan` computes that header and every
tensor's byte range once; a writer then keeps a whole file in one preallocated buffer (header
included) and only the tensors' bytes change from one version to the next. Readers of a byte
range (a delta between versions, a relay that forwards chunks) use the same table.

What it owns: the layout (pure: no torch, no I/O). What it does not do: copying tensors
(consumer/snapshots/weights_buffer.py), writing or hashing files (common/weights/snapshot.py).

Invariants (what `safetensors`, transformers and vLLM check when they open the file):
- The header is padded with spaces so that the data section starts at a multiple of 8 bytes.
- Tensors are grouped by dtype, larger elements first, in the given order within a group: each
  dtype's tensors are one flat contiguous range (`TensorTable.groups`), and every tensor starts
  at a multiple of its element size.
- The ranges are contiguous, do not overlap and cover the data section exactly.
- Names are unique and not `__metadata__`; dims are non-negative.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# safetensors dtype code -> bytes per element (the codes the format defines; sub-byte ones omitted)
DTYPE_SIZES: dict[str, int] = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
_ALIGN = 8
_METADATA = "__metadata__"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor: `dtype` is a safetensors code (`"BF16"`, `"F32"`, ...), `shape` in elements."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def num_bytes(self) -> int:
        return self.numel * DTYPE_SIZES[self.dtype]


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one tensor's bytes lie in the file: `[begin, end)`, absolute byte offsets."""

    spec: TensorSpec
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class TensorTable:
    """The layout of one safetensors file. `header` is the file's first `data_start` bytes."""

    slots: tuple[Slot, ...]
    header: bytes
    num_bytes: int  # the whole file

    @property
    def data_start(self) -> int:
        return len(self.header)

    @property
    def groups(self) -> dict[str, tuple[int, int]]:
        """dtype code -> its flat `[begin, end)` byte range in the file (file order)."""
        out: dict[str, tuple[int, int]] = {}
        for s in self.slots:
            begin, _ = out.get(s.spec.dtype, (s.begin, s.end))
            out[s.spec.dtype] = (begin, s.end)
        return out

    def slot(self, name: str) -> Slot:
        for s in self.slots:
            if s.spec.name == name:
                return s
        raise KeyError(name)


def plan(specs: Iterable[TensorSpec], *, metadata: Mapping[str, str] | None = None) -> TensorTable:
    """The file layout of `specs`; `metadata` goes to `__metadata__` (e.g. `{"format": "pt"}`,
    which transformers requires of PyTorch checkpoints)."""
    specs = list(specs)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError("tensor names must be unique")
    for s in specs:
        if s.name == _METADATA or s.dtype not in DTYPE_SIZES or any(d < 0 for d in s.shape):
            raise ValueError(f"cannot lay out tensor {s.name!r} ({s.dtype}, {list(s.shape)})")
    # Stable sort: larger elements first keeps every tensor aligned to its element size.
    ordered = sorted(specs, key=lambda s: -DTYPE_SIZES[s.dtype])
    entries: dict[str, object] = {}
    if metadata:
        entries[_METADATA] = dict(metadata)
    offset = 0
    ranges = []
    for s in ordered:
        begin, offset = offset, offset + s.num_bytes
        ranges.append((begin, offset))
        where = [begin, offset]
        entries[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": where}
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % _ALIGN)
    header = struct.pack("<Q", len(text)) + text
    start = len(header)
    slots = tuple(
        Slot(s, start + begin, start + end) for s, (begin, end) in zip(ordered, ranges, strict=True)
    )
    return TensorTable(slots, header, start + offset)
