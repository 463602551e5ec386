"""JSON text of large objects written beside threads that must keep running.

The standard library's C encoder holds the GIL for a whole `json.dumps` call: a file of 1,024
producers' statuses (400 KB) in one call kept every other thread of the consumer, its network
thread too, from running for 30-40 ms. `dumps_sorted` writes the same text a dict entry at a
time, so the writing thread lets the others in between entries.
"""

from __future__ import annotations

import json
from typing import Any


def dumps_sorted(obj: Any, *, depth: int) -> str:
    """`json.dumps(obj, sort_keys=True)`, the same text, with the dicts of the first `depth`
    levels (string keys) encoded an entry at a time."""
    if depth <= 0 or not isinstance(obj, dict):
        return json.dumps(obj, sort_keys=True)
    inner = depth - 1
    entries = (f"{json.dumps(k)}: {dumps_sorted(v, depth=inner)}" for k, v in sorted(obj.items()))
    return "{" + ", ".join(entries) + "}"
