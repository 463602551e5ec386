"""Episodes on the wire (schema v9): sampled and inserted tokens, one bit each.

An episode's completion holds the model's turns and the environment's messages in between;
`sampled_bits` marks which tokens the model sampled, and every per-token array that describes
sampled tokens (behaviour log-probs, versions, kept sets) holds sampled tokens only.
"""

from __future__ import annotations

import dataclasses
import tracemalloc
import typing

import numpy as np
import pytest
from test_wire import RUN, TRUNCATED, group

from common import wire
from common.errors import WireError

EPISODES = dataclasses.replace(RUN, max_completion_tokens=1 << 20)  # max_episode_tokens


def bits(mask: list[int]) -> np.ndarray:
    return np.packbits(np.array(mask, np.uint8), bitorder="little")


def episode_group(**changes: typing.Any) -> wire.Group:
    """G = 2 episodes: [s s i i s] and [s i s]: 5 sampled tokens of 8 (i = inserted)."""
    fields: dict[str, typing.Any] = dict(
        completion_ids=np.array([4, 5, 6, 7, 8, 9, 10, 11], np.int32),
        completion_lens=np.array([5, 3], np.int32),
        behavior_logp=np.array([-0.5, -1.0, -2.0, -0.25, -0.75], np.float32),
        sampled_bits=bits([1, 1, 0, 0, 1, 1, 0, 1]),
        finish_reasons=("stop", "max_turns"),
        env_s=0.125,
    )
    fields.update(changes)
    return group(**fields)


def test_an_episode_group_round_trips_with_its_bits():
    g = episode_group()
    decoded = wire.decode(wire.encode(g), EPISODES)
    assert decoded.episodes
    assert decoded.num_sampled == 5
    assert decoded.num_tokens == 8
    assert decoded.env_s == 0.125
    assert decoded.sampled_mask().tolist() == [1, 1, 0, 0, 1, 1, 0, 1]
    ids, logp = decoded.completion(0)
    assert ids.tolist() == [4, 5, 6, 7, 8]
    assert logp.tolist() == [-0.5, -1.0, -2.0]
    ids, logp = decoded.completion(1)
    assert ids.tolist() == [9, 10, 11]
    assert logp.tolist() == [-0.25, -0.75]
    assert decoded.completion_sampled(1).tolist() == [True, False, True]
    assert wire.encode(decoded) == wire.encode(g)


def test_single_turn_groups_carry_no_bits_and_cost_what_they_did():
    g = group()
    assert not g.episodes
    assert g.sampled_mask().all()
    assert b"sampled_bits" not in wire.encode(g)
    assert wire.decode(wire.encode(g), RUN).completion(1)[1].tolist() == [-1.0, -2.0]


def _episode_of(num_inserted: int, num_sampled: int = 64) -> wire.Group:
    """One episode of G = 2 (the other one token): `num_sampled` sampled, then inserted."""
    total = num_sampled + num_inserted
    mask = [1] * num_sampled + [0] * num_inserted + [1]
    return group(
        completion_ids=np.arange(total + 1, dtype=np.int32) % 16,
        completion_lens=np.array([total, 1], np.int32),
        behavior_logp=np.full(num_sampled + 1, -0.5, np.float32),
        sampled_bits=bits(mask),
    )


def test_an_inserted_token_costs_at_most_five_bytes_and_a_sampled_one_eight_and_a_bit():
    base = len(wire.encode(_episode_of(8)))
    inserted = (len(wire.encode(_episode_of(8 + 800))) - base) / 800
    assert inserted <= 5.0
    assert inserted == pytest.approx(4.125, abs=0.01)
    sampled = (len(wire.encode(_episode_of(8, 64 + 800))) - base) / 800
    assert sampled == pytest.approx(8.125, abs=0.01)  # an id, a log-prob and its bit
    single = group(
        completion_ids=np.arange(1001, dtype=np.int32) % 16,
        completion_lens=np.array([1000, 1], np.int32),
        behavior_logp=np.full(1001, -0.5, np.float32),
    )
    assert (len(wire.encode(single)) - len(wire.encode(group()))) / 998 == pytest.approx(
        8, abs=0.02
    )


@pytest.mark.parametrize(
    ("changes", "reason", "detail"),
    [
        (
            {"sampled_bits": np.array([255, 0], np.uint8)},
            "length_mismatch",
            "sampled_bits must hold one bit per completion token",
        ),
        (
            {"sampled_bits": np.array([0b00110011, 0b1], np.uint8)},
            "length_mismatch",
            "sampled_bits must hold one bit per completion token",
        ),
        (
            {
                "completion_ids": np.arange(9, dtype=np.int32),
                "completion_lens": np.array([5, 4], np.int32),
                "sampled_bits": np.array([0b10110011, 0b10], np.uint8),
                "behavior_logp": np.full(6, -1.0, np.float32),
            },
            "bad_value",
            "sampled_bits: pad bits past the last token must be 0",
        ),
        (
            {"sampled_bits": bits([1, 1, 0, 0, 1, 0, 1, 1])},
            "bad_value",
            "an episode must start with a sampled token",
        ),
        (
            {"behavior_logp": np.full(6, -1.0, np.float32)},
            "length_mismatch",
            "len(logprobs) != the number of sampled tokens",
        ),
        (
            {"token_versions": np.array([2, 2, 3, 3, 3, 3, 3, 3], np.int32)},
            "length_mismatch",
            "token_versions must be empty or one per sampled token",
        ),
        (
            {"env_s": float("nan")},
            "bad_value",
            "gen_s and env_s must be finite, env_s >= 0",
        ),
        (
            {"env_s": -1.0},
            "bad_value",
            "gen_s and env_s must be finite, env_s >= 0",
        ),
    ],
    ids=[
        "bits_too_long",
        "bits_too_short",
        "pad_bits_set",
        "starts_inserted",
        "logprobs_for_inserted",
        "versions_for_inserted",
        "env_s_nan",
        "env_s_negative",
    ],
)
def test_a_bad_episode_is_refused_with_its_reason(changes, reason, detail):
    data = wire.encode(episode_group(**changes))
    with pytest.raises(WireError) as info:
        wire.decode(data, EPISODES)
    assert (info.value.reason, info.value.detail) == (reason, detail)
    assert info.value.lease_id == 7  # whom to tell


def test_versions_and_kept_sets_follow_the_sampled_tokens_only():
    g = episode_group(token_versions=np.array([2, 2, 3, 3, 3], np.int32))
    assert wire.decode(wire.encode(g), EPISODES).token_versions.tolist() == [2, 2, 3, 3, 3]
    kept = episode_group(  # K per sampled token: {4, 1}, {5}, {8, 0}, {9}, {11, 2, 3}
        kept_counts=np.array([1, 0, 1, 0, 2], np.uint8),
        kept_ids=np.array([1, 0, 2, 3], np.int32),
        behavior_logp=np.array([-0.5, 0.0, -2.0, 0.0, -0.75], np.float32),
    )
    decoded = wire.decode(
        wire.encode(kept), dataclasses.replace(TRUNCATED, max_completion_tokens=8)
    )
    assert decoded.completion_kept(1).ids.tolist() == [2, 3]
    # checked against the sampled tokens' ids: the last set lists its own token (11)
    bad = dataclasses.replace(kept, kept_ids=np.array([1, 0, 2, 11], np.int32))
    with pytest.raises(WireError) as info:
        wire.decode(wire.encode(bad), dataclasses.replace(TRUNCATED, max_completion_tokens=8))
    assert info.value.reason == "bad_kept_set"


def test_decoding_a_long_episode_stays_within_the_memory_bound():
    g = _episode_of(200_000, 1_000)
    data = wire.encode(g)
    limits = EPISODES
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        decoded = wire.decode(data, limits)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert decoded.num_tokens == 201_001
    assert peak <= wire.alloc_bound(len(data), limits, wire.Group)
