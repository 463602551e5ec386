"""Reading msgpack from untrusted bytes within a memory and work budget (for common/wire/codec).

msgpack's own unpacker builds the whole object tree before anyone can look at it: an empty array
is one byte on the wire and a Python list of ~60, so a message of nested empty arrays costs ~64x
its size, and a hostile message decides how much the receiver allocates. This reader is the other
way round: the schema (common/wire/messages.py) asks for the value it expects at a position,
and only that value is built. Everything here raises only `WireError`.

- `Reader.skip(pos)` walks one value without building anything: it checks that the bytes are
  well-formed msgpack (no reserved byte, no ext type, no length past the end, map keys str or
  bin), that containers hold at most `max_items` entries and nest at most `MAX_DEPTH` deep, and
  that the message has at most `max_objects` values in all (a bound on the work, since every
  byte could start a value). It is iterative: no Python recursion on untrusted structure.
- `Reader.head(pos)` reads one value's header: `(tag, value or length, position after it)`.
- The typed reads build one scalar each (`read_int`, `read_str`, `read_bytes`) and charge its
  size to the budget first (`charge`); once the budget is spent, decoding stops with
  `over_budget`. Costs are CPython 3.11+ object sizes (what `sys.getsizeof` reports), rounded
  up; a container is charged for its list and its tuple (or dict) before its items are read.
- `read_entries` + `build` read a map into a frozen dataclass led by its type hints (`read_of`
  compiles one read per hint: int, float, str, bytes, bool, `X | None`, `tuple[X, ...]`,
  `dict[str, float]`, nested dataclasses; fields named in the class's `ARRAYS` are raw bytes of a
  fixed dtype, viewed by numpy). A key twice is `duplicate_key`; an unknown key
  `unknown_field`; a missing required field `missing_field`; anything of another type
  `bad_type`. The map of keys a dataclass is built from is refunded once it is built.

Errors never contain untrusted values beyond `show(...)`: ints, floats, bools, None, and strings
cut to `SHOW_CHARS` characters; anything else appears by its type name.
"""

from __future__ import annotations

import codecs
import dataclasses
import re
import struct
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from common.errors import WireError

MAX_DEPTH = 32  # the schema nests 4 deep (welcome -> status -> acks -> ack); msgpack allows 1024
SHOW_CHARS = 32
# Tags of `head`.
INT, FLOAT, STR, BIN, NIL, BOOL, ARRAY, MAP = range(8)
TYPE_NAMES = ("int", "float", "str", "bytes", "NoneType", "bool", "list", "dict")

# CPython object sizes in bytes (3.11+, 64-bit), each rounded up.
INT_BASE, INT_DIGIT = 24, 4  # an int is 24 bytes plus 4 per 30-bit digit
FLOAT_BYTES = 24
BYTES_BASE = 33
STR_BASE = 80  # compact str header (40 ASCII, 56 Latin-1 or wider) plus room
TUPLE_BASE, SLOT_BYTES = 40, 8
OBJECT_BASE = 64  # a slotted dataclass instance, before its slots
DICT_BASE, DICT_ENTRY = 184, 60  # entries include the old table while a dict grows
_ANY_WIDE = re.compile(rb"[\xc4-\xff]")  # a UTF-8 lead byte of a code point above U+00FF
_ANY_ASTRAL = re.compile(rb"[\xf0-\xff]")  # ... above U+FFFF (4 bytes per char in a str)
_U16, _U32, _U64 = struct.Struct(">H"), struct.Struct(">I"), struct.Struct(">Q")
_I8, _I16, _I32, _I64 = (struct.Struct(f">{c}") for c in "bhiq")
_F32, _F64 = struct.Struct(">f"), struct.Struct(">d")
_ARRAY_OBJECT_BYTES = 112 + BYTES_BASE  # a numpy array object over its bytes
_U8 = struct.Struct(">B")
# Type bytes that are the whole header: type byte -> (tag, value or length), else None.
_SINGLE: list[tuple[int, Any] | None] = [None] * 256
for _b in range(256):
    if _b <= 0x7F or _b >= 0xE0:
        _SINGLE[_b] = (INT, _b if _b <= 0x7F else _b - 0x100)
    elif _b <= 0xBF:
        _SINGLE[_b] = (
            (MAP, _b & 0x0F)
            if _b <= 0x8F
            else (ARRAY, _b & 0x0F)
            if _b <= 0x9F
            else (STR, _b & 0x1F)
        )
    elif _b in (0xC0, 0xC2, 0xC3):
        _SINGLE[_b] = (NIL, None) if _b == 0xC0 else (BOOL, _b == 0xC3)
# Headers with a fixed-size field after the type byte: type byte -> (tag, field codec).
_FIXED: dict[int, tuple[int, struct.Struct]] = {
    0xC4: (BIN, _U8),
    0xC5: (BIN, _U16),
    0xC6: (BIN, _U32),
    0xCA: (FLOAT, _F32),
    0xCB: (FLOAT, _F64),
    0xCC: (INT, _U8),
    0xCD: (INT, _U16),
    0xCE: (INT, _U32),
    0xCF: (INT, _U64),
    0xD0: (INT, _I8),
    0xD1: (INT, _I16),
    0xD2: (INT, _I32),
    0xD3: (INT, _I64),
    0xD9: (STR, _U8),
    0xDA: (STR, _U16),
    0xDB: (STR, _U32),
    0xDC: (ARRAY, _U16),
    0xDD: (ARRAY, _U32),
    0xDE: (MAP, _U16),
    0xDF: (MAP, _U32),
}


def not_msgpack(detail: str) -> WireError:
    return WireError("not_msgpack", detail)


class Reader:
    """Typed reads from one message (`data`), charging what they build to `budget` bytes."""

    __slots__ = ("budget", "data", "end", "max_items", "max_objects", "num_objects")

    def __init__(self, data: memoryview, *, budget: int, max_items: int, max_objects: int) -> None:
        self.data, self.end = data, len(data)
        self.budget, self.max_items, self.max_objects = budget, max_items, max_objects
        self.num_objects = 0

    def charge(self, num_bytes: int) -> None:
        """Account for an object about to be built; `over_budget` once the budget is spent."""
        self.budget -= num_bytes
        if self.budget < 0:
            raise WireError("over_budget", "decoding would allocate more than the message allows")

    def _need(self, pos: int, size: int) -> int:
        if pos + size > self.end:
            raise not_msgpack("truncated")
        return pos + size

    def head(self, pos: int) -> tuple[int, Any, int]:
        """(tag, value, next): for INT/FLOAT/BOOL/NIL the value and the position after it; for
        STR/BIN the payload's length and start; for ARRAY/MAP the number of entries and the
        position of the first."""
        if pos >= self.end:
            raise not_msgpack("truncated")
        b = self.data[pos]
        pos += 1
        single = _SINGLE[b]
        if single is not None:
            return single[0], single[1], pos
        spec = _FIXED.get(b)
        if spec is None:
            raise not_msgpack("reserved byte 0xc1" if b == 0xC1 else "an ext type")
        tag, codec = spec
        end = self._need(pos, codec.size)
        return tag, codec.unpack_from(self.data, pos)[0], end

    def end_of(self, start: int, length: int) -> int:
        """The position after a str or bin payload of `length` bytes at `start`."""
        return self._need(start, length)

    def skip(self, pos: int) -> int:
        """The position after the value at `pos`, checking it all (see the module doc)."""
        tag, value, after = self.head(pos)
        if tag < ARRAY:  # a scalar: no walk
            self.num_objects += 1
            if self.num_objects > self.max_objects:
                raise not_msgpack(f"more than {self.max_objects} values")
            return self._need(after, value) if tag in (STR, BIN) else after
        todo, in_map = 1, False
        stack: list[tuple[int, bool]] = []
        while True:
            while todo == 0:
                if not stack:
                    return pos
                todo, in_map = stack.pop()
            is_key = in_map and todo % 2 == 0
            todo -= 1
            self.num_objects += 1
            if self.num_objects > self.max_objects:
                raise not_msgpack(f"more than {self.max_objects} values")
            tag, value, pos = self.head(pos)
            if is_key and tag not in (STR, BIN):
                raise not_msgpack(f"a map key of type {TYPE_NAMES[tag]}")
            if tag in (STR, BIN):
                pos = self._need(pos, int(value))
            elif tag in (ARRAY, MAP):
                n = self.entries(tag, value, pos)
                if len(stack) >= MAX_DEPTH:
                    raise not_msgpack(f"nested deeper than {MAX_DEPTH}")
                stack.append((todo, in_map))
                todo, in_map = (2 * n if tag == MAP else n), tag == MAP

    def entries(self, tag: int, value: Any, pos: int) -> int:
        """The number of entries of the list or map whose header `head` read; not_msgpack if
        it is more than `max_items` or than the bytes left could hold."""
        n = int(value)
        if n > self.max_items:
            raise not_msgpack(f"a container of {n} entries > {self.max_items}")
        if n * (2 if tag == MAP else 1) > self.end - pos:  # every entry takes a byte
            raise not_msgpack("truncated")
        return n

    # -- typed scalars ---------------------------------------------------------------------------
    def read_int(self, value: int) -> int:
        if not -5 <= value <= 256:  # CPython caches these
            self.charge(INT_BASE + INT_DIGIT * max(1, -(-value.bit_length() // 30)))
        return value

    def read_str(self, start: int, length: int) -> str:
        raw = self.data[start : self._need(start, length)]
        if length <= 64:  # short: charge the widest case rather than look
            width = 4
        else:
            width = 4 if _ANY_ASTRAL.search(raw) else 2 if _ANY_WIDE.search(raw) else 1
        self.charge(STR_BASE + width * length)
        try:
            return codecs.utf_8_decode(raw, "strict", True)[0]
        except UnicodeDecodeError:
            raise not_msgpack("a string is not UTF-8") from None

    def read_bytes(self, start: int, length: int) -> bytes:
        self.charge(BYTES_BASE + length)
        return bytes(self.data[start : self._need(start, length)])

    def show(self, tag: int, value: Any, start: int) -> str:
        """A bounded description of the value whose `head` was (tag, value, start), for error
        details: scalars as themselves, a string cut to SHOW_CHARS characters, else its type."""
        if tag in (INT, FLOAT, BOOL, NIL):
            return repr(value)
        if tag == STR:
            raw = self.data[start : start + min(int(value), 4 * SHOW_CHARS)]
            text = codecs.utf_8_decode(raw, "replace", False)[0]
            cut = len(text) > SHOW_CHARS or int(value) > len(raw)
            return repr(text[:SHOW_CHARS]) + ("…" if cut else "")
        return TYPE_NAMES[tag]


# ---------------------------------------------------------------------------------------------
# Typed reads of dataclasses (led by their type hints)

# A typed read: (reader, position of the value, where it is for errors) -> (value, next position)
Read = Callable[[Reader, int, str], tuple[Any, int]]


@dataclass(frozen=True, slots=True)
class _Field:
    read: Read
    required: bool


_PLANS: dict[type[Any], dict[str, _Field]] = {}
_NAMES: dict[bytes | memoryview, str] = {}  # UTF-8 of each field name of a prepared class -> it
_READS: dict[Any, Read] = {}


def _plan(cls: type[Any]) -> dict[str, _Field]:
    """How to read each field of the dataclass `cls` (built once per class). Fields named in
    its `ARRAYS` class attribute are raw bytes of the dtype given there."""
    plan = _PLANS.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls)
        arrays = getattr(cls, "ARRAYS", {})
        plan = _PLANS[cls] = {
            f.name: _Field(
                _array_read(arrays[f.name]) if f.name in arrays else read_of(hints[f.name]),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
        }
        _NAMES.update({name.encode(): name for name in plan})
    return plan


def prepare(*classes: type[Any], names: tuple[str, ...] = ()) -> None:
    """Build the reads of `classes` (and the classes they contain) now, so that decoding a
    message never builds a cache (what decoding allocates is then what the message costs);
    `names` are more map keys to know without decoding them."""
    for cls in classes:
        _plan(cls)
    _NAMES.update({name.encode(): name for name in names})


def read_entries(r: Reader, n: int, pos: int, where: str) -> tuple[dict[str, int], int]:
    """A map's entries as {key: position of its value} and the position after the map; every
    value is walked (`Reader.skip`). A bin key is kept under a name no field has. Charged: the
    dict, each key that is built (a str that is no field name of the schema, the name of a bin
    key) and each position that is not a cached small int."""
    r.charge(DICT_BASE + n * DICT_ENTRY)
    out: dict[str, int] = {}
    for _ in range(n):
        tag, length, start = r.head(pos)
        if tag == STR:  # a field name of the schema is looked up, not decoded (nor charged)
            key = _NAMES.get(r.data[start : r.end_of(start, length)]) or r.read_str(start, length)
        elif tag == BIN:
            key = f"<bytes #{len(out)}>"
            r.charge(STR_BASE + len(key))
        else:
            raise not_msgpack(f"a map key of type {TYPE_NAMES[tag]}")
        if key in out:
            raise WireError("duplicate_key", f"{where}: {key[:SHOW_CHARS]!r}")
        out[key] = value_at = r.read_int(r.end_of(start, length))
        pos = r.skip(value_at)
    return out, pos


def build(r: Reader, cls: type[Any], entries: dict[str, int], where: str) -> Any:
    """An instance of the dataclass `cls` from a map's `entries` (see `_entries`)."""
    plan = _plan(cls)
    unknown = [k for k in entries if k not in plan]
    if unknown:
        names = [k[:SHOW_CHARS] for k in sorted(unknown)[:3]]
        raise WireError("unknown_field", f"{where}: {names}")
    kwargs = {}
    for name, f in plan.items():
        at = entries.get(name)
        if at is not None:
            kwargs[name] = f.read(r, at, f"{where}.{name}")[0]
        elif f.required:
            raise WireError("missing_field", f"{where}.{name}")
    r.charge(OBJECT_BASE + SLOT_BYTES * len(plan))
    return cls(**kwargs)


def fixed_cost(tp: Any) -> int:
    """The most the typed reads charge for one value of type `tp` (int, float, bool, str, a
    dataclass of those, or a tuple of one of them: two items' worth) beyond 4 bytes per byte of
    its strings' characters (`read_str` charges at most that, plus `STR_BASE`): every int at its
    largest (64 bits), every string's header. What one item of a list of `tp` may build that
    its own bytes do not pay for."""
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        fields = dataclasses.fields(tp)
        own = OBJECT_BASE + SLOT_BYTES * len(fields)
        return own + sum(fixed_cost(hints[f.name]) for f in fields)
    if typing.get_origin(tp) is tuple:  # tuple[X, ...]: room for two items (a system and a user
        (item, _) = typing.get_args(tp)  # turn); the message's own bytes pay for more
        return TUPLE_BASE + 2 * (2 * SLOT_BYTES + fixed_cost(item))
    costs = {int: INT_BASE + INT_DIGIT * 3, float: FLOAT_BYTES, bool: 0, str: STR_BASE}
    return costs[tp]


def read_of(tp: Any) -> Read:
    """The typed read of the type hint `tp` (built once per hint)."""
    read = _READS.get(tp)
    if read is None:
        read = _READS[tp] = _make_read(tp)
    return read


def _make_read(tp: Any) -> Read:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        some = read_of(inner)

        def optional(r: Reader, pos: int, where: str) -> tuple[Any, int]:
            tag, _, end = r.head(pos)
            return (None, end) if tag == NIL else some(r, pos, where)

        return optional
    if dataclasses.is_dataclass(tp):
        cls: type[Any] = tp  # type: ignore[assignment]
        _plan(cls)  # nested classes are prepared with their container

        def struct(r: Reader, pos: int, where: str) -> tuple[Any, int]:
            tag, n, start = r.head(pos)
            if tag != MAP:
                raise WireError("bad_type", f"{where} is not a map")
            before = r.budget
            entries, end = read_entries(r, r.entries(tag, n, start), start, where)
            transient = before - r.budget  # the entries map and its keys go once it is built
            msg = build(r, cls, entries, where)
            r.budget += transient
            return msg, end

        return struct
    if origin is tuple:
        item = read_of(typing.get_args(tp)[0])

        def tuple_(r: Reader, pos: int, where: str) -> tuple[Any, int]:
            tag, n, at = r.head(pos)
            if tag != ARRAY:
                raise WireError("bad_type", f"{where} is not a list")
            n = r.entries(tag, n, at)
            r.charge(TUPLE_BASE + 2 * SLOT_BYTES * n)  # a list of the items, then the tuple
            items: list[Any] = [None] * n  # sized once: a growing list would peak higher
            for i in range(n):
                items[i], at = item(r, at, f"{where}[]")
            return tuple(items), at

        return tuple_
    if origin is dict:
        return _counters
    if tp not in (int, float, str, bytes, bool):
        raise AssertionError(f"no wire reader for {tp}")
    name = f": expected {tp.__name__}"

    def scalar(r: Reader, pos: int, where: str) -> tuple[Any, int]:
        tag, value, start = r.head(pos)
        if tp is str and tag == STR:
            return r.read_str(start, value), r.end_of(start, value)
        if tp is int and tag == INT:
            return r.read_int(value), start
        if tp is float and tag in (INT, FLOAT):
            r.charge(FLOAT_BYTES)
            return float(value), start
        if tp is bytes and tag == BIN:
            return r.read_bytes(start, value), r.end_of(start, value)
        if tp is bool and tag == BOOL:
            return value, start
        raise WireError("bad_type", where + name)

    return scalar


def _counters(r: Reader, pos: int, where: str) -> tuple[dict[str, float], int]:
    """A map of str to numbers (the heartbeat's counters), as floats."""
    tag, n, pos = r.head(pos)
    problem = WireError("bad_type", f"{where} is not a map of str to numbers")
    if tag != MAP:
        raise problem
    n = r.entries(tag, n, pos)
    r.charge(DICT_BASE + DICT_ENTRY * n)
    out: dict[str, float] = {}
    for _ in range(n):
        key_tag, length, start = r.head(pos)
        if key_tag != STR:
            raise problem
        key = r.read_str(start, length)
        value_tag, value, pos = r.head(r.end_of(start, length))
        if value_tag not in (INT, FLOAT):
            raise problem
        if key in out:
            raise WireError("duplicate_key", f"{where}: {key[:SHOW_CHARS]!r}")
        r.charge(FLOAT_BYTES)
        out[key] = float(value)
    return out, pos


def _array_read(dtype: np.dtype[Any]) -> Read:
    """The read of a `Group` array field: raw bytes of `dtype`, viewed read-only by numpy."""

    def array(r: Reader, pos: int, where: str) -> tuple[np.ndarray, int]:
        tag, length, start = r.head(pos)
        if tag != BIN:
            raise WireError("bad_type", f"{where}: expected raw bytes")
        if length % dtype.itemsize:
            raise WireError("bad_array", f"{where}: {length} bytes is not a multiple of {dtype}")
        r.charge(_ARRAY_OBJECT_BYTES)
        data = r.read_bytes(start, length)
        return np.frombuffer(data, dtype=dtype), r.end_of(start, length)

    return array
