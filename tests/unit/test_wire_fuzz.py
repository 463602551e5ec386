"""A seeded, structure-aware fuzzer of `wire.decode`: only `WireError` escapes, and decoding never
builds more than `ALLOC_FACTOR` times the message size (plus `ALLOC_BASE_BYTES`).

Cases (`cases(seed)`): valid messages of every kind, mutated (bit flips, cuts, inserted, deleted,
repeated and overwritten spans); valid bodies with one entry, at any depth, replaced by a random
msgpack value (wrong types, deep nesting, long containers of tiny values, duplicate keys, maps
keyed by binary strings, nested maps and lists of them); maps whose keys are binary strings,
often after one large value that raises the budget (each such key once cost a name and a
position the budget never saw), at the top or nested in a valid body; and raw random bytes.
The default run decodes `DEFAULT_CASES` cases; `-m slow` runs 10^6 and prints the counts.
Allocation is measured with tracemalloc around each decode.
"""

from __future__ import annotations

import random
import struct
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest
from test_wire import MESSAGES, RUN, TRUNCATED, group, truncated_group
from test_wire_episodes import EPISODES, episode_group

from common import wire
from common.errors import WireError

DEFAULT_CASES = 20_000
SLOW_CASES = 1_000_000
LIMITS = [
    wire.Limits(),
    RUN,
    TRUNCATED,
    EPISODES,
    wire.Limits(max_message_bytes=4096, max_items=64),
]
SEEDS = [wire.encode(m) for m in MESSAGES.values()] + [
    wire.encode(group(token_versions=[2, 3, 3])),
    wire.encode(truncated_group()),
    wire.encode(truncated_group(kept_counts=[2, 0, 0], kept_ids=[1, 9], kept_unknown=[2])),
    wire.encode(episode_group()),
    wire.encode(episode_group(token_versions=np.array([2, 2, 3, 3, 3], np.int32))),
]
BODIES = [msgpack.unpackb(s, raw=False) for s in SEEDS]


def bound(size: int) -> int:
    return wire.ALLOC_FACTOR * size + wire.ALLOC_BASE_BYTES


# ---------------------------------------------------------------------------------------------
# Generators


def _packed_value(rng: random.Random, budget: int) -> bytes:
    """Random msgpack bytes of one value, favouring what costs a decoder most per byte."""
    pick = rng.random()
    if pick < 0.15:  # deep nesting: arrays or maps of one
        depth = rng.choice([2, 31, 33, 100, 1000, rng.randrange(1, 5000)])
        opener = rng.choice([b"\x91", b"\x81\xa1k"])
        return opener * min(depth, max(budget // len(opener), 1)) + b"\xc0"
    if pick < 0.3:  # a long container of tiny values (empty arrays, nils, small ints, "")
        n = rng.choice([15, 16, 300, rng.randrange(0, 3000)]) if rng.random() < 0.98 else 70_000
        item = rng.choice([b"\x90", b"\xc0", b"\x01", b"\xa0", b"\x80", b"\xcd\x01\x00"])
        if rng.random() < 0.5:
            return b"\xdd" + struct.pack(">I", n) + item * n
        keys = b"".join(b"\xa3" + f"{i % 1000:03}".encode() + item for i in range(n))
        return b"\xdf" + struct.pack(">I", n) + keys
    if pick < 0.45:  # a header that claims more than follows
        return rng.choice([b"\xdd", b"\xdf", b"\xc6", b"\xdb"]) + struct.pack(
            ">I", rng.choice([2**31, 2**32 - 1, rng.randrange(2**32)])
        )
    if pick < 0.55:  # reserved and ext type bytes
        return bytes([rng.choice([0xC1, 0xC7, 0xD4, 0xD8])]) + rng.randbytes(rng.randrange(6))
    if pick < 0.65:  # a map keyed by binary strings, maybe nested
        return _binary_key_map(rng, budget) if rng.random() < 0.5 else _nested(rng, budget)
    value = rng.choice(
        [None, True, False, 0, -1, 2**63, -(2**63), 2**64 - 1, 1.5, float("nan"), "", "x" * 40,
         "\U0001f600" * 3, b"", b"\x00" * 9, [], {}, [1, [2, [3]]], {"a": {"b": {"c": 1}}},
         [True] * 3, {"": None}, rng.randbytes(rng.randrange(20))]
    )  # fmt: skip
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def _map_header(n: int) -> bytes:
    return bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n)


def _binary_key_map(rng: random.Random, budget: int) -> bytes:
    """A map keyed mostly by binary strings (empty, short or random; a few str keys): first,
    often, one large bin value (it raises the budget of the message it is in), then many
    entries of tiny values."""
    n = rng.choice([1, 15, 16, 174, 1366, rng.randrange(1, min(max(budget // 3, 2), 5000))])
    parts = []
    if rng.random() < 0.7:
        size = rng.choice([500, 24_309, rng.randrange(1, 30_000)])
        parts.append(b"\xc4\x00" + b"\xc5" + struct.pack(">H", size) + bytes(size))
    for i in range(n - len(parts)):
        pick = rng.random()
        key = (
            b"\xc4\x00"
            if pick < 0.5
            else b"\xc4" + bytes([len(k := rng.randbytes(rng.randrange(1, 9)))]) + k
            if pick < 0.9
            else b"\xa4" + f"{i % 10_000:04}".encode()
        )
        parts.append(key + rng.choice([b"\xc0", b"\x00", b"\x90", b"\x80", b"\xa0"]))
    return _map_header(len(parts)) + b"".join(parts)


def _nested(rng: random.Random, budget: int, depth: int = 0) -> bytes:
    """Maps (binary, str or schema keys) and lists of them, nested a few levels."""
    if depth >= rng.randrange(1, 5) or rng.random() < 0.2:
        return _binary_key_map(rng, budget // 4) if rng.random() < 0.3 else b"\xc0"
    n = rng.randrange(0, 6)
    items = [_nested(rng, budget // max(n, 1), depth + 1) for _ in range(n)]
    if rng.random() < 0.4:
        return (bytes([0x90 | n])) + b"".join(items)
    keys = [
        rng.choice(
            [b"\xc4\x00", b"\xc4\x01k", b"\xa6status", b"\xa4acks", b"\xa1k" + bytes([48 + i])]
        )
        for i in range(n)
    ]
    return _map_header(n) + b"".join(k + v for k, v in zip(keys, items, strict=True))


def _type_confusion(rng: random.Random) -> bytes:
    """A valid body with one entry (at any depth of maps) replaced by a random value."""
    body = msgpack.unpackb(rng.choice(SEEDS), raw=False)
    node, key = body, None
    while True:
        key = rng.choice(sorted(node))
        if isinstance(node[key], dict) and node[key] and rng.random() < 0.5:
            node = node[key]
            continue
        break
    marker = "\x00MARK\x00"
    node[key] = marker
    packed = msgpack.packb(body, use_bin_type=True)
    mark = msgpack.packb(marker)
    return packed.replace(mark, _packed_value(rng, 4 * len(packed) + 1000), 1)


def _mutation(rng: random.Random) -> bytes:
    data = bytearray(rng.choice(SEEDS))
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        pos = rng.randrange(max(len(data), 1))
        if op == 0 and data:
            data[pos] ^= 1 << rng.randrange(8)
        elif op == 1:
            del data[pos:]
        elif op == 2:
            data[pos:pos] = rng.randbytes(rng.randint(1, 9))
        elif op == 3:
            del data[pos : pos + rng.randint(1, 9)]
        elif op == 4:
            chunk = rng.randbytes(rng.randint(1, 9))
            data[pos : pos + len(chunk)] = chunk
        else:  # repeat a span: duplicate keys, extra entries
            span = bytes(data[pos : pos + rng.randint(1, 40)])
            data[pos:pos] = span * rng.randint(1, 3)
    return bytes(data)


def cases(seed: int) -> Iterator[tuple[bytes, wire.Limits]]:
    rng = random.Random(seed)
    while True:
        pick = rng.random()
        if pick < 0.4:
            data = _mutation(rng)
        elif pick < 0.8:
            data = _type_confusion(rng)
        elif pick < 0.9:  # a whole message keyed by binary strings, or a nested structure
            data = _binary_key_map(rng, 30_000) if rng.random() < 0.6 else _nested(rng, 30_000)
        else:
            data = rng.randbytes(rng.randrange(64))
        yield data, rng.choice(LIMITS)


# ---------------------------------------------------------------------------------------------
# The run


def fuzz(seed: int, num_cases: int, *, measure_every: int = 1) -> dict[str, float]:
    """Decode `num_cases` cases; fails at the first exception other than WireError or the first
    decode that allocates over the bound (measured on every `measure_every`-th case: tracemalloc
    slows decoding ~10x). Returns counts by outcome, the worst
    peak / bound, and the worst peak / size of cases of 64 KiB or more."""
    outcomes: Counter[str] = Counter()
    worst = 0.0  # peak / bound, over all cases
    worst_ratio_large = 0.0  # peak / size, over cases of at least 64 KiB
    for i, (data, limits) in zip(range(num_cases), cases(seed), strict=False):
        measure = i % measure_every == 0
        if measure:
            tracemalloc.start()
        try:
            try:
                msg = wire.decode(data, limits)
                outcomes["accepted"] += 1
            except WireError as exc:
                outcomes[exc.reason] += 1
                msg = None
            except Exception as exc:  # the finding: say which case
                raise AssertionError(f"case {i} (seed {seed}): {type(exc).__name__}") from exc
            if not measure:
                continue
            peak = tracemalloc.get_traced_memory()[1]
            del msg
        finally:
            tracemalloc.stop()
        outcomes["measured"] += 1
        assert peak <= bound(len(data)), (i, len(data), peak)
        worst = max(worst, peak / bound(len(data)))
        if len(data) >= 64 << 10:
            worst_ratio_large = max(worst_ratio_large, peak / len(data))
    return {
        **outcomes,
        "cases": num_cases,
        "worst_peak_over_bound": worst,
        "worst_peak_over_size_64k_plus": worst_ratio_large,
    }


def test_the_fuzzer_finds_only_wire_errors_and_allocations_within_the_bound():
    stats = fuzz(seed=0, num_cases=DEFAULT_CASES, measure_every=10)
    assert stats["cases"] == DEFAULT_CASES
    assert stats["not_msgpack"] > 100  # the cases reach every layer of the decoder
    assert stats["bad_type"] > 100
    assert stats["accepted"] > 100
    assert stats["bad_kept_set"] > 0  # the kept sets' checks are reached too


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_million_fuzz_cases_find_only_wire_errors_and_allocations_within_the_bound():
    t0 = time.perf_counter()
    stats = fuzz(seed=1, num_cases=SLOW_CASES)
    print(f"\nwire fuzz: {stats} in {time.perf_counter() - t0:.0f} s")


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x81\xa6schema" + b"\x91" * 1000 + b"\xc0", id="deep_1009_bytes"),
        pytest.param(b"\x81\xa6schema\xdd" + struct.pack(">I", 983_000) + b"\x90" * 983_000,
                     id="983k_empty_arrays"),
        pytest.param(b"\x81\xa6schema" + (b"\x9f" + b"\x90" * 15) * 60_000 + b"", id="wide_nest"),
        pytest.param(b"\x82\xa6schema\x04\xa4kind\xa9heartbeat" + b"\x00" * 10, id="trailing"),
        # maps keyed by binary strings after one large value (once 1.58x and 1.27x the bound)
        pytest.param(b"\xde\x05\x57" + b"\xc4\x00" + b"\xc5\x5e\xf5" + bytes(24309)
                     + b"\xc4\x00\xc0" * 1366, id="1366_binary_keys_28k"),
        pytest.param(b"\xde\x00\xaf" + b"\xc4\x00" + b"\xc5\x01\xf4" + bytes(500)
                     + b"\xc4\x00\xc0" * 174, id="174_binary_keys_1k"),
    ],
)  # fmt: skip
def test_known_attack_messages_are_refused_within_the_allocation_bound(data):
    tracemalloc.start()
    try:
        with pytest.raises(WireError):
            wire.decode(data, wire.Limits())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= bound(len(data)), peak
