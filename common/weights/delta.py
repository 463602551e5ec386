"""Sparse deltas between two snapshot files of one tensor table (pure: numpy, no torch, no I/O
but the thin `apply_file` at the end).

A delta turns the bytes of snapshot `base_version` into the bytes of snapshot `version`. Both files
have the same layout (common/weights/tensor_table.py: same header bytes, every tensor at the same
byte range), so a delta only lists, per tensor, the elements whose bits changed and their new bits,
compared **bitwise in the snapshot dtype** (a bf16 weight whose update was too small to move its
bf16 value costs nothing; -0.0 vs 0.0 and NaN payloads count as changes, so applying is exact). Per
tensor the smallest of three index encodings is kept (k changes of e-byte elements among n),
followed by the k new values (`k * e` bytes):

- `gap`: one byte per change in most cases: the gaps between consecutive changed indices
  (the first counted from -1), each gap g >= 1 written as `(g - 1) // 255` zero bytes then the
  byte `(g - 1) % 255 + 1`; decoding is a cumulative sum where a zero byte counts 255. About
  `k` bytes while changes are denser than one in 255 elements (bf16 at 1.4% changed: 3 bytes
  per change, 2.1% of the tensor's bytes);
- `pos`: the changed indices (U32, or U64 past 2^32 elements), `4k` bytes (very sparse tensors);
- `mask`: one bit per element (`numpy.packbits`, little bit order), `ceil(n / 8)` bytes (dense).

The delta file is itself a safetensors file (the same `plan` lays it out; nothing loads it as
weights: it is named `weights.delta`, never `*.safetensors`). Its tensors are `<name>\x00gap`,
`<name>\x00pos` or `<name>\x00mask`, and `<name>\x00val` (values as unsigned integers of the
element size: bits, not numbers), and `__metadata__` holds `format = asyncgrpo-delta-1`,
`base_version`, `version`, `base_hash` (BLAKE3 of the base file) and `result_hash` (BLAKE3 of the
resulting file, i.e. the target snapshot's manifest hash).

Invariants:
- `apply` only on exactly the base: the caller names the hash of the file it holds and
  `check_base` refuses any other (`DeltaError`); the result is then hashed and must equal
  `result_hash` (`apply_file` removes it otherwise): a delta can never put bytes into an engine
  that differ from the snapshot it stands for.
- A delta is validated whole (`read_delta`: names, dtypes, counts, positions in range, sorted
  strictly increasing) before one byte of the target is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import numpy as np

from common.errors import SnapshotError
from common.weights.tensor_table import DTYPE_SIZES, TensorSpec, plan

FORMAT = "asyncgrpo-delta-1"
DELTA_FILE = "weights.delta"
_SEP = "\x00"
INDEX_KINDS = ("gap", "pos", "mask")
_UINT: dict[int, np.dtype[Any]] = {
    1: np.dtype("<u1"),
    2: np.dtype("<u2"),
    4: np.dtype("<u4"),
    8: np.dtype("<u8"),
}
_UINT_CODE = {1: "U8", 2: "U16", 4: "U32", 8: "U64"}
_MAX_HEADER = 100 << 20


class DeltaError(SnapshotError):
    """A delta that does not apply: another base, a layout change, or inconsistent contents."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each tensor of a safetensors file lies: name -> (dtype code, begin, end), absolute
    byte offsets; `header` is the file's first `data_start` bytes."""

    header: bytes
    tensors: Mapping[str, tuple[str, int, int]]

    @property
    def data_start(self) -> int:
        return len(self.header)


@dataclass(frozen=True, slots=True)
class Patch:
    """The changed elements of one tensor: `index` in encoding `kind` (`INDEX_KINDS`, see the
    module doc) and `values`, the new bits (unsigned, element-sized), in index order."""

    name: str
    kind: str
    index: np.ndarray
    values: np.ndarray

    @property
    def num_bytes(self) -> int:
        return int(self.index.nbytes + self.values.nbytes)

    def positions(self, n: int) -> np.ndarray:
        """The changed indices (sorted) in a tensor of `n` elements."""
        if self.kind == "mask":
            return np.flatnonzero(np.unpackbits(self.index, count=n, bitorder="little"))
        if self.kind == "gap":
            return _gap_positions(self.index)
        return self.index


@dataclass(frozen=True, slots=True)
class Delta:
    base_version: int
    version: int
    base_hash: str
    result_hash: str
    patches: tuple[Patch, ...]


def read_layout(data: bytes | memoryview | np.ndarray) -> Layout:
    """The layout in a safetensors file's header (`data` holds at least the header).
    `DeltaError` for anything that is not a well-formed header."""
    buf = (
        np.asarray(data, dtype=np.uint8).data if isinstance(data, np.ndarray) else memoryview(data)
    )
    if len(buf) < 8:
        raise DeltaError("not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", bytes(buf[:8]))
    if n > _MAX_HEADER or 8 + n > len(buf):
        raise DeltaError(f"safetensors header of {n} bytes does not fit")
    try:
        entries = json.loads(bytes(buf[8 : 8 + n]))
        tensors: dict[str, tuple[str, int, int]] = {}
        for name, entry in entries.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            dtype = entry["dtype"]
            if (
                dtype not in DTYPE_SIZES
                or not 0 <= begin <= end
                or (end - begin) % DTYPE_SIZES[dtype]
            ):
                raise ValueError(f"tensor {name[:64]!r}")
            tensors[name] = (dtype, 8 + n + int(begin), 8 + n + int(end))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DeltaError(f"malformed safetensors header ({exc})") from None
    return Layout(bytes(buf[: 8 + n]), tensors)


def metadata_of(data: bytes | memoryview) -> dict[str, str]:
    """The `__metadata__` map of a safetensors header."""
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    try:
        meta = json.loads(bytes(data[8 : 8 + n])).get("__metadata__", {})
    except ValueError as exc:
        raise DeltaError(f"malformed safetensors header ({exc})") from None
    if not isinstance(meta, dict):
        raise DeltaError("malformed __metadata__")
    return {str(k): str(v) for k, v in meta.items()}


def diff(layout: Layout, base: np.ndarray, new: np.ndarray) -> list[Patch]:
    """The patches that turn file bytes `base` into `new` (uint8 arrays of one layout).
    Tensors whose bits are all equal get no patch."""
    if len(base) != len(new) or bytes(base[: layout.data_start]) != bytes(new[: layout.data_start]):
        raise DeltaError("the two files differ in layout: a delta needs the same header")
    patches = []
    for name, (dtype, begin, end) in layout.tensors.items():
        size = DTYPE_SIZES[dtype]
        old_e, new_e = base[begin:end].view(_UINT[size]), new[begin:end].view(_UINT[size])
        positions = np.flatnonzero(old_e != new_e)
        if not len(positions):
            continue
        values = new_e[positions]
        n, k = len(new_e), len(positions)
        gaps = np.diff(positions, prepend=-1)
        gap_bytes = k + int(((gaps - 1) // 255).sum())
        pos_dtype = _UINT[4] if n <= 1 << 32 else _UINT[8]
        sizes = {"gap": gap_bytes, "pos": k * pos_dtype.itemsize, "mask": (n + 7) // 8}
        kind = min(sizes, key=lambda x: sizes[x])
        if kind == "gap":
            index = _encode_gaps(gaps, gap_bytes)
        elif kind == "pos":
            index = positions.astype(pos_dtype)
        else:
            changed = np.zeros(n, dtype=np.bool_)
            changed[positions] = True
            index = np.packbits(changed, bitorder="little")
        patches.append(Patch(name, kind, index, values))
    return patches


def _encode_gaps(gaps: np.ndarray, num_bytes: int) -> np.ndarray:
    """Gaps >= 1 as bytes: `(g - 1) // 255` zeros, then `(g - 1) % 255 + 1` (module doc)."""
    extra = (gaps - 1) // 255
    out = np.zeros(num_bytes, dtype=np.uint8)
    ends = np.cumsum(extra + 1) - 1
    out[ends] = ((gaps - 1) % 255 + 1).astype(np.uint8)
    return out


def _gap_positions(index: np.ndarray) -> np.ndarray:
    steps = np.where(index == 0, 255, index.astype(np.int64))
    positions: np.ndarray = np.cumsum(steps)[index != 0] - 1
    return positions


def encode_delta(layout: Layout, delta: Delta) -> tuple[bytes, list[np.ndarray]]:
    """The delta file as its header and the arrays that follow it, in file order (write them
    one after the other: no copy of the values is made)."""
    specs, arrays = [], []
    for p in delta.patches:
        dtype, _, _ = layout.tensors[p.name]
        index = p.index
        specs.append(TensorSpec(f"{p.name}{_SEP}{p.kind}", _UINT_CODE[index.itemsize], index.shape))
        specs.append(
            TensorSpec(f"{p.name}{_SEP}val", _UINT_CODE[DTYPE_SIZES[dtype]], p.values.shape)
        )
        arrays += [index, p.values]
    meta = {
        "format": FORMAT,
        "base_version": str(delta.base_version),
        "version": str(delta.version),
        "base_hash": delta.base_hash,
        "result_hash": delta.result_hash,
    }
    table = plan(specs, metadata=meta)
    by_name = {s.name: a for s, a in zip(specs, arrays, strict=True)}
    return table.header, [np.ascontiguousarray(by_name[s.spec.name]) for s in table.slots]


def delta_bytes(header: bytes, arrays: Iterable[np.ndarray]) -> int:
    return len(header) + sum(a.nbytes for a in arrays)


def read_delta(data: np.ndarray, target: Layout) -> Delta:
    """Parse and validate delta file bytes (uint8 array) against the `target` layout (the base
    file's, which the result keeps). `DeltaError` for anything inconsistent."""
    own = read_layout(data)
    meta = metadata_of(memoryview(own.header))
    if meta.get("format") != FORMAT:
        raise DeltaError(f"not a delta file (format {meta.get('format', '')[:32]!r})")
    try:
        base_version, version = int(meta["base_version"]), int(meta["version"])
        base_hash, result_hash = meta["base_hash"], meta["result_hash"]
    except (KeyError, ValueError) as exc:
        raise DeltaError(f"delta metadata incomplete ({exc})") from None
    if own.tensors and max(end for _, _, end in own.tensors.values()) > len(data):
        raise DeltaError("delta file is truncated")
    names: dict[str, dict[str, np.ndarray]] = {}
    for key, (code, begin, end) in own.tensors.items():
        name, _, tag = key.rpartition(_SEP)
        if tag not in (*INDEX_KINDS, "val") or code not in _UINT_CODE.values():
            raise DeltaError(f"unexpected delta entry {key[:64]!r}")
        size = DTYPE_SIZES[code]
        names.setdefault(name, {})[tag] = data[begin:end].view(_UINT[size])
    patches = []
    for name, parts in names.items():
        if name not in target.tensors:
            raise DeltaError(f"delta names a tensor the snapshot lacks: {name[:64]!r}")
        dtype, begin, end = target.tensors[name]
        size = DTYPE_SIZES[dtype]
        n = (end - begin) // size
        values = parts.pop("val", None)
        if values is None or values.itemsize != size or len(parts) != 1:
            raise DeltaError(f"delta entry for {name[:64]!r} is incomplete")
        ((kind, index),) = parts.items()
        patch = Patch(name, kind, index, values)
        if not _consistent(patch, n):
            raise DeltaError(f"delta index of {name[:64]!r} is out of range or disagrees")
        patches.append(patch)
    return Delta(base_version, version, base_hash, result_hash, tuple(patches))


def _consistent(p: Patch, n: int) -> bool:
    """The index of `p` names exactly `len(p.values)` distinct elements of `n`, increasing."""
    k = len(p.values)
    if p.kind == "mask":
        if len(p.index) != (n + 7) // 8:
            return False
        return int(np.unpackbits(p.index, count=n, bitorder="little").sum()) == k
    if p.kind == "gap" and len(p.index) and p.index[-1] == 0:
        return False  # a gap cut short
    if p.kind == "pos" and p.index.itemsize < 4:
        return False
    pos = p.positions(n).astype(np.int64)
    if len(pos) != k:
        return False
    return not k or (int(pos[-1]) < n and int(pos[0]) >= 0 and bool((np.diff(pos) > 0).all()))


def check_base(delta: Delta, held_hash: str) -> None:
    """`DeltaError` unless the file held (BLAKE3 `held_hash`) is exactly the delta's base."""
    if held_hash != delta.base_hash:
        raise DeltaError(
            f"delta v{delta.base_version}->v{delta.version} is for base {delta.base_hash[:12]}…, "
            f"held {held_hash[:12]}…"
        )


def apply(layout: Layout, target: np.ndarray, delta: Delta) -> None:
    """Write the delta's new values into `target` (a writable uint8 copy of the base file)."""
    for p in delta.patches:
        dtype, begin, end = layout.tensors[p.name]
        view = target[begin:end].view(_UINT[DTYPE_SIZES[dtype]])
        if p.kind == "mask":
            changed = np.unpackbits(p.index, count=len(view), bitorder="little").view(np.bool_)
            view[changed] = p.values
        else:
            view[p.positions(len(view))] = p.values


def apply_file(base: Path, delta_path: Path, out: Path, *, base_hash: str) -> str:
    """Write the delta's result to the new file `out` from the file `base` (whose BLAKE3 the
    caller verified: `base_hash`); return the result's hash, equal to the delta's
    `result_hash`, or raise `DeltaError` (nothing left at `out`)."""
    try:
        blob = np.fromfile(delta_path, dtype=np.uint8)
        shutil.copyfile(base, out)
        target = np.memmap(out, dtype=np.uint8, mode="r+")
        layout = read_layout(target)
        delta = read_delta(blob, layout)
        check_base(delta, base_hash)
        apply(layout, target, delta)
        target.flush()
        got = blake3.blake3(target.data, max_threads=blake3.blake3.AUTO).hexdigest()
        del target
        if got != delta.result_hash:
            raise DeltaError(
                f"delta v{delta.base_version}->v{delta.version}: result hash {got[:12]}… != "
                f"{delta.result_hash[:12]}…"
            )
        return got
    except OSError as exc:  # e.g. the base file is gone: the caller takes the full weights
        out.unlink(missing_ok=True)
        raise DeltaError(f"cannot apply the delta: {exc}") from None
    except BaseException:
        out.unlink(missing_ok=True)
        raise


def write_delta(path: Path, header: bytes, arrays: list[np.ndarray]) -> str:
    """Write a delta file (new file, not fsynced: the snapshot's finalize does that); return
    its BLAKE3 hash."""
    hasher = blake3.blake3()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        parts = [memoryview(header), *(a.reshape(-1).view(np.uint8).data for a in arrays)]
        for view in parts:
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
            hasher.update(view)
    finally:
        os.close(fd)
    return hasher.hexdigest()


def summary(delta: Delta) -> dict[str, Any]:
    """Counts for logs and benchmarks."""
    return {
        "tensors_changed": len(delta.patches),
        "elements_changed": sum(len(p.values) for p in delta.patches),
        "bytes": sum(p.num_bytes for p in delta.patches),
    }
