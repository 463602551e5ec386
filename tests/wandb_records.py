"""Read back a W&B offline run file (`run-ID.wandb`) in tests: W&B's own record protobufs in
the LevelDB log framing its writer uses (a 7-byte file header `:W&B`, magic, version; then
32 KiB blocks of records, each a 7-byte header: CRC32, length, type FULL/FIRST/MIDDLE/LAST)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every `wandb_internal_pb2.Record` of the file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    out, pos, parts = [], HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 and length == 0:  # zero fill to the end of the block
            pos += left
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        parts = chunk if kind in (FULL, FIRST) else parts + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(parts)
            out.append(record)
    return out


def history(path: Path) -> list[dict[str, Any]]:
    """The logged rows (`run.log`), each {key: value}."""
    rows = []
    for r in records(path):
        if r.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                         for i in r.history.item})  # fmt: skip
    return rows


def config(path: Path) -> dict[str, Any]:
    """The run's config as logged ({key: value}, the last value of each key)."""
    out: dict[str, Any] = {}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        items = (
            r.config.update if kind == "config" else r.run.config.update if kind == "run" else []
        )
        for item in items:
            out[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out
