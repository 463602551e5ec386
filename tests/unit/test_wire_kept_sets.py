"""Wire schema 4's kept sets (truncated sampling): golden bytes, no byte for an untruncated group,
4 bytes per kept id, decoding within the allocation bound, and every legal truncated group
accepted and round-tripped (its rejections are in tests/unit/test_wire.py's table)."""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import assert_same, groups
from test_wire import EDGE_RUN, PROPERTY, TRUNCATED, UNTRUNCATED, group, truncated_group

from common import wire
from common.errors import WireError
from common.sampling import kept_set

# Golden encoding of `truncated_group()` (kept sets: uint8 counts and the other ids, int32). A
# change here means the bytes on the wire changed: bump wire.SCHEMA_VERSION.
GOLDEN_TRUNCATED_GROUP_HEX = (
    "de0014a6736368656d6109a46b696e64a567726f7570a86c656173655f696407ab70726f64756365"
    "725f6964a27030ac70726f6d70745f696e64657809b06265686176696f725f76657273696f6e02aa"
    "70726f6d70745f696473c40c010000000200000003000000ae636f6d706c6574696f6e5f696473c4"
    "0c040000000500000006000000af636f6d706c6574696f6e5f6c656e73c4080100000002000000ad"
    "6265686176696f725f6c6f6770c40c000080be00000000000000bfae746f6b656e5f76657273696f"
    "6e73c400a772657761726473c4080000803f00000000ae66696e6973685f726561736f6e7392a473"
    "746f70a66c656e677468ab74656d7065726174757265cb3fe8000000000000b16e756d5f72657761"
    "72645f6572726f727300a567656e5f73cb3fd0000000000000ab6b6570745f636f756e7473c40302"
    "0001a86b6570745f696473c40c010000000900000000000000aa6576616c756174696f6ec2a5656e"
    "765f73cb0000000000000000"
)


def test_a_truncated_group_round_trips_and_matches_its_golden_bytes():
    msg = truncated_group()
    data = wire.encode(msg)
    assert data.hex() == "".join(GOLDEN_TRUNCATED_GROUP_HEX)
    got = wire.decode(data, TRUNCATED)
    assert_same(got, msg)
    assert got.kept.sizes().tolist() == [3, 1, 2]
    assert got.completion_kept(1).offsets.tolist() == [0, 0, 1]
    assert got.completion_kept(1).ids.tolist() == [0]


def test_an_untruncated_group_carries_no_byte_of_kept_sets():
    data = wire.encode(group())
    assert b"kept_" not in data
    assert data == wire.encode(dataclasses.replace(group(), kept_unknown=np.zeros(0, np.int32)))
    assert not wire.decode(data, UNTRUNCATED).kept.present


def test_kept_sets_cost_one_byte_per_token_and_four_per_further_kept_id():
    """The sampled id is not repeated in its set and a set's size travels in one byte, so the
    extra bytes are 1 per token and 4 per kept id beyond the sampled one, plus two keys: the
    whole group within 8 bytes per token (id, log-prob) + 4 per kept id (|K| per token, the
    sampled one included), with 3 bytes per token to spare."""
    G, L, P, k = 8, 256, 16, 20
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 150_000, G * L, dtype=np.int32)
    others = [np.setdiff1d(rng.choice(150_000, k, replace=False), [t])[: k - 1] for t in tokens]
    kept = kept_set.from_lists([o.astype(np.int32) for o in others])
    base = wire.Group(
        lease_id=(3 << 40) | 12345, producer_id="host-12345", prompt_index=123456,
        behavior_version=41, prompt_ids=rng.integers(0, 150_000, P, dtype=np.int32),
        completion_ids=tokens, completion_lens=np.full(G, L, np.int32),
        behavior_logp=-rng.random(G * L, dtype=np.float32), token_versions=np.zeros(0, np.int32),
        rewards=rng.random(G, dtype=np.float32), finish_reasons=("length",) * G,
        temperature=1.0, num_reward_errors=0, gen_s=1.5,
    )  # fmt: skip
    msg = dataclasses.replace(base, kept_counts=kept.other_counts(), kept_ids=kept.ids)
    extra = len(wire.encode(msg)) - len(wire.encode(base))
    num_tokens, num_kept = G * L, G * L * k  # |K| summed over the tokens, the sampled one included
    keys = len("kept_counts") + len("kept_ids") + 2 + 3 + 5  # str headers; bin16, bin32
    assert extra == num_tokens + 4 * (num_kept - num_tokens) + keys
    assert len(wire.encode(msg)) <= 5 * num_tokens + 4 * num_kept + 4 * P + 8 * G + 450
    limits = wire.Limits(vocab_size=150_000, group_size=G, temperature=1.0, max_kept=k)
    assert wire.decode(wire.encode(msg), limits).kept.sizes().tolist() == [k] * (G * L)


def test_decoding_kept_sets_stays_within_the_allocation_bound():
    G, L, k = 4, 512, 64
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 1000, G * L, dtype=np.int32)
    others = [np.setdiff1d(rng.choice(1000, k, replace=False), [t])[: k - 1] for t in tokens]
    kept = kept_set.from_lists([o.astype(np.int32) for o in others])
    msg = wire.Group(
        lease_id=1, producer_id="p", prompt_index=0, behavior_version=0,
        prompt_ids=np.array([1, 2], np.int32), completion_ids=tokens,
        completion_lens=np.full(G, L, np.int32), behavior_logp=np.zeros(G * L, np.float32),
        token_versions=np.zeros(0, np.int32), rewards=np.zeros(G, np.float32),
        finish_reasons=("length",) * G, temperature=1.0, kept_counts=kept.other_counts(),
        kept_ids=kept.ids,
    )  # fmt: skip
    data = wire.encode(msg)
    limits = wire.Limits(vocab_size=1000, group_size=G, temperature=1.0, max_kept=k)
    tracemalloc.start()
    try:
        got = wire.decode(data, limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.kept.ids.nbytes > len(data) / 2  # the kept ids are most of the message
    assert peak <= wire.ALLOC_FACTOR * len(data) + wire.ALLOC_BASE_BYTES, (peak, len(data))


EDGE_TRUNCATED = dataclasses.replace(EDGE_RUN, max_kept=4)


@PROPERTY
@given(g=groups(EDGE_TRUNCATED))
def test_every_legal_group_of_a_truncated_run_is_accepted_and_round_trips(g):
    data = wire.encode(g)
    assert_same(wire.decode(data, EDGE_TRUNCATED), g)
    assert wire.decode(data, EDGE_RUN) is not None  # no run to check against: accepted too
    with pytest.raises(WireError) as info:
        wire.decode(data, dataclasses.replace(EDGE_RUN, max_kept=0))
    assert info.value.reason == "sampling_mismatch"


@PROPERTY
@given(g=groups(EDGE_TRUNCATED), data=st.data())
def test_a_legal_kept_set_with_its_sampled_token_listed_is_refused(g, data):
    t = data.draw(st.integers(0, g.num_tokens - 1).filter(lambda t: t not in g.kept_unknown))
    offsets = g.kept.offsets
    others = [g.kept_ids[offsets[i] : offsets[i + 1]] for i in range(g.num_tokens)]
    others[t] = np.sort(np.append(others[t], g.completion_ids[t])).astype(np.int32)
    bad = kept_set.from_lists(others, g.kept_unknown.tolist())
    msg = dataclasses.replace(g, kept_counts=bad.other_counts(), kept_ids=bad.ids)
    with pytest.raises(WireError) as info:
        wire.decode(wire.encode(msg), EDGE_TRUNCATED)
    assert info.value.reason == "bad_kept_set"
