"""Wire schema v9: round trips, golden bytes, zero-copy arrays, size, every rejection, fuzzing."""

from __future__ import annotations

import dataclasses
import math
import tracemalloc
import typing

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import (
    EDGE_LOGPROBS,
    F32_LOWEST,
    assert_same,
    groups,
    messages,
    omitting_optional,
    optional_fields,
)

from common import wire
from common.errors import WireError

# ---------------------------------------------------------------------------------------------
# One sample message of every kind.

SNAPSHOT = wire.SnapshotInfo(version=3, num_bytes=1024, hash="af13", path="/r/v000003/m")
STATUS = wire.Status(
    run_id="a1b2-0",
    policy_version=3,
    snapshot=SNAPSHOT,
    acks=(wire.Ack(7, "trained"), wire.Ack(8, "expired")),
    finished=False,
)
SPEC = wire.RunSpec(
    group_size=2,
    vocab_size=16,
    max_staleness=1,
    temperature=0.75,
    top_p=0.9,
    top_k=8,
    min_p=0.05,
    max_kept=16,
    max_new_tokens=4,
    prompt_format="raw",
    model="demo",
    rollouts_port=5556,
    announce_port=5557,
    heartbeat_s=1.0,
    max_message_bytes=1 << 20,
    reward_fns=(wire.RewardWeight("exact_match", 1.0), wire.RewardWeight("m:f", 0.5)),
    reward_timeout_s=5.0,
    data_port=5558,
)
LEASE = wire.Lease(
    lease_id=(1 << 40) | 5,
    prompt_index=9,
    step=4,
    min_version=3,
    prompt="2+2=",
    answer="4",
    messages=(),
    columns="",
)
CHAT_LEASE = wire.Lease(
    lease_id=6, prompt_index=10, step=4, min_version=3, prompt="", answer="",
    messages=(wire.ChatTurn("system", "Be brief."), wire.ChatTurn("user", "2+2?")),
    columns='{"unit": "cm", "tolerance": 0.5}',
)  # fmt: skip
# The limits of the run that `group()` belongs to.
RUN = wire.Limits(
    vocab_size=16, group_size=2, temperature=0.75, max_prompt_tokens=8, max_completion_tokens=4
)


def group(**changes: typing.Any) -> wire.Group:
    """A valid group of the run `RUN` (G = 2); arrays given as lists get the schema's dtype."""
    fields: dict[str, typing.Any] = dict(
        lease_id=7, producer_id="p0", prompt_index=9, behavior_version=2,
        prompt_ids=[1, 2, 3], completion_ids=[4, 5, 6], completion_lens=[1, 2],
        behavior_logp=[-0.5, -1.0, -2.0], token_versions=[], rewards=[1.0, 0.0],
        finish_reasons=("stop", "length"), temperature=0.75, num_reward_errors=0, gen_s=0.25,
    )  # fmt: skip
    fields.update(changes)
    for name, dtype in (
        ("prompt_ids", np.int32), ("completion_ids", np.int32), ("completion_lens", np.int32),
        ("token_versions", np.int32), ("behavior_logp", np.float32), ("rewards", np.float32),
        ("reward_parts", np.float32),
    ):  # fmt: skip
        if name not in fields:
            continue
        if isinstance(fields[name], list):
            fields[name] = np.array(fields[name], dtype=dtype)
    return wire.Group(**fields)


# A truncated run (top-k / top-p / min-p) of the same shape: every group carries its kept sets.
TRUNCATED = dataclasses.replace(RUN, max_kept=4)
UNTRUNCATED = dataclasses.replace(RUN, max_kept=0)


def truncated_group(**changes: typing.Any) -> wire.Group:
    """`group()` with kept sets: K = {4, 1, 9}, {5}, {6, 0} (the sampled token, then the others)."""
    fields: dict[str, typing.Any] = dict(
        kept_counts=[2, 0, 1], kept_ids=[1, 9, 0], kept_unknown=[],
        behavior_logp=[-0.25, 0.0, -0.5],
    )  # fmt: skip
    fields.update(changes)
    for name in ("kept_counts", "kept_ids", "kept_unknown"):
        if isinstance(fields[name], list):
            fields[name] = np.array(fields[name], wire.Group.ARRAYS[name])
    return group(**fields)


MESSAGES: dict[str, typing.Any] = {
    "register": wire.Register(
        req=1, producer_id="p0", host="h", pid=42, engine="fake", loaded_version=3,
        held_leases=(7, 8),
    ),
    "heartbeat": wire.Heartbeat(
        req=2, producer_id="p0", loaded_version=3, state="generating", num_in_flight=2,
        counters={"groups_sent": 5.0, "reward_errors": 0.0},
    ),
    "lease_req": wire.LeaseRequest(req=3, producer_id="p0", max_leases=4, loaded_version=3),
    "goodbye": wire.Goodbye(req=5, producer_id="p0", held_leases=(7,)),
    "fetch_req": wire.FetchRequest(
        req=7, producer_id="p0", version=3, held_version=2, held_hash="ab12",
        relay=wire.Source("tcp://10.0.0.2:6000", "k"),
    ),
    "fetch_done": wire.FetchDone(
        req=8, producer_id="p0", version=3, file="delta", ok=True, num_bytes=6,
        bad_sources=(wire.BadSource("tcp://10.0.0.3:6000", "wrong_bytes"),), serving=True,
    ),
    "file_chunk_req": wire.FileChunkRequest(
        req=9, version=3, file="weights", offset=0, max_bytes=4096
    ),
    "fetch_plan": wire.FetchPlan(
        req=7, version=3, file="delta", base_version=2, num_bytes=6, hash="cd34",
        result_hash="af13", chunk_bytes=4, chunk_hashes=bytes(range(64)),
        sources=(wire.Source("tcp://10.0.0.2:6000", "k"), wire.Source("", "")), wait_s=0.0,
    ),
    "welcome": wire.Welcome(req=1, spec=SPEC, status=STATUS),
    "status": wire.StatusReply(req=2, status=wire.Status("a1b2-0", 3, None, (), True)),
    "lease_grant": wire.LeaseGrant(req=3, leases=(LEASE, CHAT_LEASE), status=STATUS),
    "chunk_head": wire.ChunkHead(req=4, version=3, offset=0, total_bytes=6, num_bytes=6),
    "reject": wire.Reject(req=6, reason="not_registered", detail="register first"),
    "group": group(),
    "announce": wire.Announce(run_id="a1b2-0", policy_version=3, snapshot=SNAPSHOT),
}  # fmt: skip

# Golden encodings, generated once from MESSAGES. A change here means the bytes on the wire
# changed: that is a schema change, so bump wire.SCHEMA_VERSION (old and new peers can't talk).
GOLDEN_HEX = {
    "register": (
        "89a6736368656d6109a46b696e64a87265676973746572a372657101ab70726f64756365725f6964"
        "a27030a4686f7374a168a37069642aa6656e67696e65a466616b65ae6c6f616465645f7665727369"
        "6f6e03ab68656c645f6c6561736573920708"
    ),
    "heartbeat": (
        "88a6736368656d6109a46b696e64a9686561727462656174a372657102ab70726f64756365725f69"
        "64a27030ae6c6f616465645f76657273696f6e03a57374617465aa67656e65726174696e67ad6e75"
        "6d5f696e5f666c6967687402a8636f756e7465727382ab67726f7570735f73656e74cb4014000000"
        "000000ad7265776172645f6572726f7273cb0000000000000000"
    ),
    "lease_req": (
        "89a6736368656d6109a46b696e64a96c656173655f726571a372657103ab70726f64756365725f69"
        "64a27030aa6d61785f6c656173657304ae6c6f616465645f76657273696f6e03a86465636c696e65"
        "6490af6d61785f6576616c5f6c656173657300a6776169745f73cb0000000000000000"
    ),
    "goodbye": (
        "85a6736368656d6109a46b696e64a7676f6f64627965a372657105ab70726f64756365725f6964a2"
        "7030ab68656c645f6c65617365739107"
    ),
    "fetch_req": (
        "88a6736368656d6109a46b696e64a966657463685f726571a372657107ab70726f64756365725f69"
        "64a27030a776657273696f6e03ac68656c645f76657273696f6e02a968656c645f68617368a46162"
        "3132a572656c617982a8656e64706f696e74b37463703a2f2f31302e302e302e323a36303030aa73"
        "65727665725f6b6579a16b"
    ),
    "fetch_done": (
        "8aa6736368656d6109a46b696e64aa66657463685f646f6e65a372657108ab70726f64756365725f"
        "6964a27030a776657273696f6e03a466696c65a564656c7461a26f6bc3a96e756d5f627974657306"
        "ab6261645f736f75726365739182a8656e64706f696e74b37463703a2f2f31302e302e302e333a36"
        "303030a6726561736f6eab77726f6e675f6279746573a773657276696e67c3"
    ),
    "file_chunk_req": (
        "87a6736368656d6109a46b696e64ae66696c655f6368756e6b5f726571a372657109a77665727369"
        "6f6e03a466696c65a777656967687473a66f666673657400a96d61785f6279746573cd1000"
    ),
    "fetch_plan": (
        "8da6736368656d6109a46b696e64aa66657463685f706c616ea372657107a776657273696f6e03a4"
        "66696c65a564656c7461ac626173655f76657273696f6e02a96e756d5f627974657306a468617368"
        "a463643334ab726573756c745f68617368a461663133ab6368756e6b5f627974657304ac6368756e"
        "6b5f686173686573c440000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d"
        "1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3fa7736f757263"
        "65739282a8656e64706f696e74b37463703a2f2f31302e302e302e323a36303030aa736572766572"
        "5f6b6579a16b82a8656e64706f696e74a0aa7365727665725f6b6579a0a6776169745f73cb000000"
        "0000000000"
    ),
    "welcome": (
        "85a6736368656d6109a46b696e64a777656c636f6d65a372657101a473706563de0016aa67726f75"
        "705f73697a6502aa766f6361625f73697a6510ad6d61785f7374616c656e65737301ab74656d7065"
        "726174757265cb3fe8000000000000a5746f705f70cb3feccccccccccccda5746f705f6b08a56d69"
        "6e5f70cb3fa999999999999aa86d61785f6b65707410ae6d61785f6e65775f746f6b656e7304ad70"
        "726f6d70745f666f726d6174a3726177a56d6f64656ca464656d6fad726f6c6c6f7574735f706f72"
        "74cd15b4ad616e6e6f756e63655f706f7274cd15b5ab6865617274626561745f73cb3ff000000000"
        "0000b16d61785f6d6573736167655f6279746573ce00100000aa7265776172645f666e739282a266"
        "6eab65786163745f6d61746368a6776569676874cb3ff000000000000082a2666ea36d3a66a67765"
        "69676874cb3fe0000000000000b07265776172645f74696d656f75745f73cb4014000000000000a9"
        "646174615f706f7274cd15b6ac6576616c5f73616d706c657301b06576616c5f74656d7065726174"
        "757265cb3ff0000000000000ab6d6f64656c5f66696c657390a8657069736f646573c0a673746174"
        "757388a672756e5f6964a6613162322d30ae706f6c6963795f76657273696f6e03a8736e61707368"
        "6f7484a776657273696f6e03a96e756d5f6279746573cd0400a468617368a461663133a470617468"
        "ac2f722f763030303030332f6da461636b739282a86c656173655f696407a76f7574636f6d65a774"
        "7261696e656482a86c656173655f696408a76f7574636f6d65a765787069726564a866696e697368"
        "6564c2ac6576616c5f76657273696f6effa96576616c5f66726f6dffab6865617274626561745f73"
        "cb3ff0000000000000"
    ),
    "status": (
        "84a6736368656d6109a46b696e64a6737461747573a372657102a673746174757388a672756e5f69"
        "64a6613162322d30ae706f6c6963795f76657273696f6e03a8736e617073686f74c0a461636b7390"
        "a866696e6973686564c3ac6576616c5f76657273696f6effa96576616c5f66726f6dffab68656172"
        "74626561745f73cb3ff0000000000000"
    ),
    "lease_grant": (
        "85a6736368656d6109a46b696e64ab6c656173655f6772616e74a372657103a66c65617365739289"
        "a86c656173655f6964cf0000010000000005ac70726f6d70745f696e64657809a47374657004ab6d"
        "696e5f76657273696f6e03a670726f6d7074a4322b323da6616e73776572a134a86d657373616765"
        "7390a7636f6c756d6e73a0ac6576616c5f76657273696f6eff89a86c656173655f696406ac70726f"
        "6d70745f696e6465780aa47374657004ab6d696e5f76657273696f6e03a670726f6d7074a0a6616e"
        "73776572a0a86d657373616765739282a4726f6c65a673797374656da7636f6e74656e74a9426520"
        "62726965662e82a4726f6c65a475736572a7636f6e74656e74a4322b323fa7636f6c756d6e73d920"
        "7b22756e6974223a2022636d222c2022746f6c6572616e6365223a20302e357dac6576616c5f7665"
        "7273696f6effa673746174757388a672756e5f6964a6613162322d30ae706f6c6963795f76657273"
        "696f6e03a8736e617073686f7484a776657273696f6e03a96e756d5f6279746573cd0400a4686173"
        "68a461663133a470617468ac2f722f763030303030332f6da461636b739282a86c656173655f6964"
        "07a76f7574636f6d65a7747261696e656482a86c656173655f696408a76f7574636f6d65a7657870"
        "69726564a866696e6973686564c2ac6576616c5f76657273696f6effa96576616c5f66726f6dffab"
        "6865617274626561745f73cb3ff0000000000000"
    ),
    "chunk_head": (
        "87a6736368656d6109a46b696e64aa6368756e6b5f68656164a372657104a776657273696f6e03a6"
        "6f666673657400ab746f74616c5f627974657306a96e756d5f627974657306"
    ),
    "reject": (
        "85a6736368656d6109a46b696e64a672656a656374a372657106a6726561736f6eae6e6f745f7265"
        "6769737465726564a664657461696cae7265676973746572206669727374"
    ),
    "group": (
        "de0012a6736368656d6109a46b696e64a567726f7570a86c656173655f696407ab70726f64756365"
        "725f6964a27030ac70726f6d70745f696e64657809b06265686176696f725f76657273696f6e02aa"
        "70726f6d70745f696473c40c010000000200000003000000ae636f6d706c6574696f6e5f696473c4"
        "0c040000000500000006000000af636f6d706c6574696f6e5f6c656e73c4080100000002000000ad"
        "6265686176696f725f6c6f6770c40c000000bf000080bf000000c0ae746f6b656e5f76657273696f"
        "6e73c400a772657761726473c4080000803f00000000ae66696e6973685f726561736f6e7392a473"
        "746f70a66c656e677468ab74656d7065726174757265cb3fe8000000000000b16e756d5f72657761"
        "72645f6572726f727300a567656e5f73cb3fd0000000000000aa6576616c756174696f6ec2a5656e"
        "765f73cb0000000000000000"
    ),
    "announce": (
        "85a6736368656d6109a46b696e64a8616e6e6f756e6365a672756e5f6964a6613162322d30ae706f"
        "6c6963795f76657273696f6e03a8736e617073686f7484a776657273696f6e03a96e756d5f627974"
        "6573cd0400a468617368a461663133a470617468ac2f722f763030303030332f6d"
    ),
}


def body_of(msg: typing.Any) -> dict[str, typing.Any]:
    """The decoded msgpack map of an encoded message (tests may build bodies by hand)."""
    return msgpack.unpackb(wire.encode(msg), raw=False)


def pack(body: typing.Any) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def edited(msg: typing.Any, *path: str, value: typing.Any) -> bytes:
    """`msg`'s bytes with the body entry at `path` (keys into nested maps) set to `value`."""
    body = body_of(msg)
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return pack(body)


def without(msg: typing.Any, *path: str) -> bytes:
    """`msg`'s bytes with the body entry at `path` removed."""
    body = body_of(msg)
    node = body
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return pack(body)


KINDS = {cls.KIND: cls for cls in typing.get_args(wire.Message)}


# ---------------------------------------------------------------------------------------------
# Round trips and golden bytes


def test_the_samples_cover_every_message_kind():
    assert set(MESSAGES) == set(KINDS) == set(GOLDEN_HEX)
    assert all(kind == type(m).KIND for kind, m in MESSAGES.items())


@pytest.mark.parametrize("kind", sorted(MESSAGES))
def test_every_kind_round_trips_to_an_equal_message(kind):
    msg = MESSAGES[kind]
    limits = RUN if kind == "group" else wire.Limits()
    decoded = wire.decode(wire.encode(msg), limits)
    assert_same(decoded, msg)
    assert wire.encode(decoded) == wire.encode(msg)


def test_a_group_with_per_function_rewards_round_trips_and_reads_as_f_by_g():
    msg = group(rewards=[1.5, 0.0], reward_parts=[1.0, 0.0, 1.0, 0.0])
    decoded = wire.decode(wire.encode(msg), dataclasses.replace(RUN, num_reward_fns=2))
    assert_same(decoded, msg)
    assert decoded.reward_parts_FG().tolist() == [[1.0, 0.0], [1.0, 0.0]]
    assert group().reward_parts_FG().shape == (0, 2)
    assert b"reward_parts" not in wire.encode(group())  # none sent, none on the wire


def test_a_group_with_per_token_versions_round_trips():
    msg = group(behavior_version=2, token_versions=[2, 3, 3])
    assert_same(wire.decode(wire.encode(msg), RUN), msg)


@pytest.mark.parametrize("kind", sorted(MESSAGES))
def test_encoding_matches_the_golden_bytes(kind):
    # A failure means the bytes on the wire changed: bump SCHEMA_VERSION, then regenerate.
    assert wire.encode(MESSAGES[kind]).hex() == "".join(GOLDEN_HEX[kind])


@pytest.mark.parametrize("kind", sorted(MESSAGES))
def test_schema_is_the_first_key_and_kind_the_second(kind):
    body = body_of(MESSAGES[kind])
    assert list(body)[:2] == ["schema", "kind"]
    assert body["schema"] == wire.SCHEMA_VERSION
    assert body["kind"] == kind


def test_group_arrays_of_other_dtypes_are_encoded_in_the_schema_dtype():
    msg = group(
        prompt_ids=np.array([1, 2, 3], np.int64),
        behavior_logp=np.array([-0.5, -1.0, -2.0], np.float64),
        rewards=np.array([1, 0], np.int64),
    )
    assert wire.encode(msg) == wire.encode(group())


# ---------------------------------------------------------------------------------------------
# Arrays and size


ARRAY_DTYPES = {
    "prompt_ids": np.int32,
    "completion_ids": np.int32,
    "completion_lens": np.int32,
    "token_versions": np.int32,
    "behavior_logp": np.float32,
    "rewards": np.float32,
}


@pytest.mark.parametrize("name", sorted(ARRAY_DTYPES))
def test_arrays_decode_as_read_only_views_of_the_unpacked_bytes(name):
    g = wire.decode(wire.encode(group(token_versions=[2, 3, 3])), RUN)
    arr = getattr(g, name)
    assert arr.dtype == np.dtype(ARRAY_DTYPES[name])
    assert arr.flags.writeable is False
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    # The only buffer is the immutable bytes object msgpack produced for this field: no copy.
    assert isinstance(base, bytes)
    assert len(base) == arr.nbytes
    assert np.shares_memory(arr, np.frombuffer(base, np.uint8))
    with pytest.raises(ValueError, match="read-only"):
        arr[:1] = 0


def test_completion_returns_views_into_the_flat_arrays():
    g = wire.decode(wire.encode(group()), RUN)
    ids, logp = g.completion(1)
    assert ids.tolist() == [5, 6]
    assert logp.tolist() == [-1.0, -2.0]
    assert np.shares_memory(ids, g.completion_ids)
    assert np.shares_memory(logp, g.behavior_logp)
    assert (g.group_size, g.num_tokens) == (2, 3)


def test_a_group_costs_about_eight_bytes_per_completion_token():
    G, L, P = 8, 256, 16
    rng = np.random.default_rng(0)
    msg = wire.Group(
        lease_id=(3 << 40) | 12345, producer_id="host-12345", prompt_index=123456,
        behavior_version=41, prompt_ids=rng.integers(0, 150_000, P, dtype=np.int32),
        completion_ids=rng.integers(0, 150_000, G * L, dtype=np.int32),
        completion_lens=np.full(G, L, np.int32),
        behavior_logp=-rng.random(G * L, dtype=np.float32), token_versions=np.zeros(0, np.int32),
        rewards=rng.random(G, dtype=np.float32), finish_reasons=("length",) * G,
        temperature=1.0, num_reward_errors=0, gen_s=1.5,
    )  # fmt: skip
    data = wire.encode(msg)
    num_tokens = G * L
    assert len(data) / num_tokens < 8.5
    assert len(data) <= 8 * num_tokens + 4 * P + 8 * G + 400  # arrays + keys and scalars
    limits = wire.Limits(vocab_size=150_000, group_size=G, temperature=1.0)
    assert wire.decode(data, limits).num_tokens == num_tokens


# ---------------------------------------------------------------------------------------------
# Rejections: every reason


def lease_grant(**changes: typing.Any) -> bytes:
    """The sample lease grant's bytes, its chat lease's fields changed."""
    body = body_of(MESSAGES["lease_grant"])
    body["leases"][1].update(changes)
    return pack(body)


GROUP_BODY_PREFIX = b"\x83\xa6schema\x04\xa4kind\xa5group\xaecompletion_ids"
REJECTIONS = [
    # (reason, id, data, limits)
    ("too_large", "over_the_limit", wire.encode(group()), wire.Limits(max_message_bytes=64)),
    ("not_msgpack", "truncated", wire.encode(group())[:-3], RUN),
    ("not_msgpack", "truncated_header", wire.encode(MESSAGES["register"])[:1], RUN),
    ("not_msgpack", "random_bytes", np.random.default_rng(1).bytes(64), RUN),
    ("not_msgpack", "trailing_data", wire.encode(MESSAGES["register"]) + b"\xc0", RUN),
    ("not_msgpack", "reserved_byte", b"\xc1", RUN),
    ("not_msgpack", "empty", b"", RUN),
    ("not_msgpack", "ext_type", b"\xd6\xff\x00\x00\x00\x00", RUN),
    ("not_msgpack", "ext_type_of_one_byte_in_a_body",
     edited(MESSAGES["register"], "req", value=msgpack.ExtType(1, b"\x00")), RUN),
    ("not_msgpack", "int_map_key", pack({1: 2}), RUN),
    ("not_msgpack", "nesting_too_deep", b"\x91" * 100_000 + b"\x00", RUN),
    ("not_a_map", "list", pack([1, 2, 3]), RUN),
    ("not_a_map", "int", pack(5), RUN),
    ("not_a_map", "str", pack("register"), RUN),
    ("schema_version", "one", edited(MESSAGES["register"], "schema", value=1), RUN),
    ("schema_version", "missing", without(MESSAGES["register"], "schema"), RUN),
    ("schema_version", "bool", edited(MESSAGES["register"], "schema", value=True), RUN),
    ("schema_version", "float", edited(MESSAGES["register"], "schema", value=1.0), RUN),
    ("schema_version", "str", edited(MESSAGES["register"], "schema", value="1"), RUN),
    ("unknown_kind", "name", edited(MESSAGES["register"], "kind", value="regster"), RUN),
    ("unknown_kind", "missing", without(MESSAGES["register"], "kind"), RUN),
    ("unknown_kind", "bytes", edited(MESSAGES["register"], "kind", value=b"register"), RUN),
    ("unknown_kind", "list", edited(MESSAGES["register"], "kind", value=[1]), RUN),
    ("unknown_kind", "map", edited(MESSAGES["register"], "kind", value={"a": 1}), RUN),
    ("unknown_field", "top", edited(MESSAGES["register"], "extra", value=1), RUN),
    ("unknown_field", "nested",
     edited(MESSAGES["welcome"], "status", "snapshot", "x", value=1), RUN),
    ("unknown_field", "group", edited(group(), "logits", value=b""), RUN),
    ("missing_field", "top", without(MESSAGES["register"], "producer_id"), RUN),
    ("missing_field", "nested", without(MESSAGES["welcome"], "spec", "vocab_size"), RUN),
    ("missing_field", "group_array", without(group(), "rewards"), RUN),
    ("bad_type", "bool_for_int", edited(MESSAGES["register"], "req", value=True), RUN),
    ("bad_type", "float_for_int", edited(MESSAGES["register"], "pid", value=42.0), RUN),
    ("bad_type", "str_for_int", edited(MESSAGES["file_chunk_req"], "offset", value="0"), RUN),
    ("bad_type", "bool_in_list", edited(MESSAGES["goodbye"], "held_leases", value=[True]), RUN),
    ("bad_type", "int_for_list", edited(MESSAGES["goodbye"], "held_leases", value=7), RUN),
    ("bad_type", "str_for_bytes", edited(MESSAGES["fetch_plan"], "chunk_hashes", value="abc"), RUN),
    ("bad_type", "list_for_bytes", edited(group(), "completion_ids", value=[4, 5, 6]), RUN),
    ("bad_type", "bool_for_group_int", edited(group(), "lease_id", value=True), RUN),
    ("bad_type", "str_for_float", edited(group(), "temperature", value="hot"), RUN),
    ("bad_type", "nested_wrong",
     edited(MESSAGES["welcome"], "status", "snapshot", "version", value="3"), RUN),
    ("bad_type", "nested_not_a_map", edited(MESSAGES["status"], "status", value=[1]), RUN),
    ("bad_type", "list_item_not_a_map", edited(MESSAGES["lease_grant"], "leases", value=[1]), RUN),
    ("bad_type", "counter_is_str",
     edited(MESSAGES["heartbeat"], "counters", value={"a": "1"}), RUN),
    ("bad_type", "counter_bool", edited(MESSAGES["heartbeat"], "counters", value={"a": True}), RUN),
    ("bad_type", "counter_bytes_key",
     edited(MESSAGES["heartbeat"], "counters", value={b"a": 1}), RUN),
    ("bad_array", "ids_not_whole_int32", edited(group(), "completion_ids", value=b"\x00" * 7), RUN),
    ("bad_array", "rewards_not_whole_f32", edited(group(), "rewards", value=b"\x00" * 6), RUN),
    ("group_size", "three_for_two", wire.encode(group(
        completion_ids=[4, 5, 6], completion_lens=[1, 1, 1], rewards=[1.0, 0.0, 1.0],
        finish_reasons=("stop",) * 3)), RUN),
    ("length_mismatch", "lens_sum_vs_ids", wire.encode(group(completion_lens=[1, 1])), RUN),
    ("length_mismatch", "logprobs_vs_ids", wire.encode(group(behavior_logp=[-1.0, -1.0])), RUN),
    ("length_mismatch", "token_versions", wire.encode(group(token_versions=[2, 2])), RUN),
    ("length_mismatch", "rewards_vs_g", wire.encode(group(rewards=[1.0, 0.0, 1.0])), RUN),
    ("length_mismatch", "finish_reasons", wire.encode(group(finish_reasons=("stop",))), RUN),
    ("length_mismatch", "no_completions", wire.encode(group(
        completion_ids=[], completion_lens=[], behavior_logp=[], rewards=[],
        finish_reasons=())), wire.Limits()),
    ("bad_length", "empty_completion", wire.encode(group(completion_lens=[0, 3])), RUN),
    ("bad_length", "negative_length", wire.encode(group(completion_lens=[-1, 4])), RUN),
    ("bad_length", "completion_too_long", wire.encode(group(
        completion_ids=[4] * 6, completion_lens=[1, 5], behavior_logp=[-1.0] * 6)), RUN),
    ("bad_length", "empty_prompt", wire.encode(group(prompt_ids=[])), RUN),
    ("bad_length", "prompt_too_long", wire.encode(group(prompt_ids=[1] * 9)), RUN),
    ("token_out_of_range", "negative", wire.encode(group(completion_ids=[4, -1, 6])), RUN),
    ("token_out_of_range", "equal_to_vocab", wire.encode(group(completion_ids=[4, 5, 16])), RUN),
    ("token_out_of_range", "prompt", wire.encode(group(prompt_ids=[1, 99, 3])), RUN),
    ("token_out_of_range", "negative_no_vocab", wire.encode(group(prompt_ids=[-5])), wire.Limits()),
    ("bad_logprob", "nan", wire.encode(group(behavior_logp=[-0.5, math.nan, -2.0])), RUN),
    ("bad_logprob", "plus_inf", wire.encode(group(behavior_logp=[-0.5, math.inf, -2.0])), RUN),
    ("bad_logprob", "minus_inf", wire.encode(group(behavior_logp=[-0.5, -math.inf, -2.0])), RUN),
    ("bad_logprob", "positive", wire.encode(group(behavior_logp=[-0.5, 0.01, -2.0])), RUN),
    ("bad_reward", "nan", wire.encode(group(rewards=[math.nan, 0.0])), RUN),
    ("bad_reward", "inf", wire.encode(group(rewards=[1.0, -math.inf])), RUN),
    ("bad_reward", "part_nan", wire.encode(group(reward_parts=[1.0, math.nan])), RUN),
    ("length_mismatch", "parts_not_f_by_g", wire.encode(group(reward_parts=[1.0, 0.0, 1.0])), RUN),
    ("length_mismatch", "parts_of_more_fns",
     wire.encode(group(reward_parts=[1.0, 0.0] * 2)), dataclasses.replace(RUN, num_reward_fns=1)),
    ("bad_value", "finish_reason", wire.encode(group(finish_reasons=("stop", "eos"))), RUN),
    ("bad_value", "behavior_version_not_min", wire.encode(group(
        behavior_version=3, token_versions=[2, 3, 3])), RUN),
    ("bad_value", "behavior_version_below_min", wire.encode(group(
        behavior_version=1, token_versions=[2, 3, 3])), RUN),
    ("bad_value", "negative_version", wire.encode(group(behavior_version=-1)), RUN),
    ("bad_value", "negative_lease_id", wire.encode(group(lease_id=-7)), RUN),
    ("bad_value", "negative_counter", wire.encode(group(num_reward_errors=-1)), RUN),
    ("bad_value", "zero_temperature", wire.encode(group(temperature=0.0)), wire.Limits()),
    ("bad_value", "nan_temperature", wire.encode(group(temperature=math.nan)), wire.Limits()),
    ("sampling_mismatch", "temperature", wire.encode(group(temperature=1.0)), RUN),
    ("bad_value", "lease_with_text_and_messages", lease_grant(prompt="2+2="), RUN),
    ("bad_value", "lease_without_a_prompt", lease_grant(messages=[]), RUN),
    ("bad_value", "chat_message_without_a_role",
     lease_grant(messages=[{"role": "", "content": "hi"}]), RUN),
    ("bad_value", "columns_not_an_object", lease_grant(columns="[1, 2]"), RUN),
    ("bad_type", "columns_as_a_map", lease_grant(columns={"unit": "cm"}), RUN),
    ("bad_type", "chat_message_as_text", lease_grant(messages=["hi"]), RUN),
    ("sampling_mismatch", "kept_sets_missing", wire.encode(group()), TRUNCATED),
    ("sampling_mismatch", "kept_sets_unasked", wire.encode(truncated_group()), UNTRUNCATED),
    ("bad_kept_set", "counts_short", wire.encode(truncated_group(kept_counts=[2, 1])), TRUNCATED),
    ("bad_kept_set", "counts_past_ids", wire.encode(truncated_group(kept_counts=[2, 0, 2])),
     TRUNCATED),
    ("bad_kept_set", "counts_short_of_ids", wire.encode(truncated_group(kept_counts=[1, 0, 1])),
     TRUNCATED),
    ("bad_kept_set", "counts_at_their_widest", wire.encode(truncated_group(
        kept_counts=[255, 255, 255])), TRUNCATED),
    ("bad_kept_set", "id_equal_to_vocab", wire.encode(truncated_group(kept_ids=[1, 16, 0])),
     TRUNCATED),
    ("bad_kept_set", "negative_id", wire.encode(truncated_group(kept_ids=[-1, 9, 0])), TRUNCATED),
    ("bad_kept_set", "not_ascending", wire.encode(truncated_group(kept_ids=[9, 1, 0])), TRUNCATED),
    ("bad_kept_set", "an_id_twice", wire.encode(truncated_group(kept_ids=[9, 9, 0])), TRUNCATED),
    ("bad_kept_set", "sampled_token_again", wire.encode(truncated_group(kept_ids=[1, 4, 0])),
     TRUNCATED),
    ("bad_kept_set", "over_max_kept", wire.encode(truncated_group(
        kept_counts=[4, 0, 1], kept_ids=[0, 1, 2, 3, 0])), TRUNCATED),
    ("bad_kept_set", "unknown_out_of_range", wire.encode(truncated_group(kept_unknown=[3])),
     TRUNCATED),
    ("bad_kept_set", "unknown_with_ids", wire.encode(truncated_group(kept_unknown=[0])),
     TRUNCATED),
    ("bad_kept_set", "ids_without_offsets", wire.encode(group(kept_ids=np.array([1], np.int32))),
     wire.Limits()),
    ("bad_array", "kept_ids_not_whole_int32", edited(truncated_group(), "kept_ids",
                                                     value=b"\x00" * 11), TRUNCATED),
    # Nesting sidesteps max_items; 1,009 bytes once reached a RecursionError through repr().
    ("not_msgpack", "deep_schema_value", b"\x81\xa6schema" + b"\x91" * 1000 + b"\xc0", RUN),
    ("not_msgpack", "too_many_values", pack([[0] * 8] * 8), wire.Limits(max_objects=60)),
    ("duplicate_key", "top", b"\x83\xa6schema\x04\xa4kind\xa5group\xa6schema\x04", RUN),
    ("duplicate_key", "nested", bytes.fromhex(GOLDEN_HEX["announce"][:-2]).replace(
        b"\x84\xa7version", b"\x85\xa7version\x03\xa7version") + b"m", RUN),
    ("duplicate_key", "counter", edited(MESSAGES["heartbeat"], "counters", value={"a": 1})
     .replace(b"\x81\xa1a\x01", b"\x82\xa1a\x01\xa1a\x02"), RUN),
    # 5 bytes on the wire, ~170 in Python per entry: refused before the budget is spent.
    ("over_budget", "tiny_counters", edited(MESSAGES["heartbeat"], "counters",
                                            value={f"{i:03}": i for i in range(500)}), RUN),
]  # fmt: skip


ONE_PROMPT = "a lease holds a prompt text or chat messages, one of them"
PEER = " (the peer runs another asyncgrpo release: run the same one on the consumer and every producer)"  # noqa: E501
# What each refusal tells the sender (and the log), besides its reason. The reader is ours
# (common/wire/reader.py), so its not_msgpack details are fixed too, not msgpack's exceptions.
DETAILS = {
    "too_large-over_the_limit": "332 bytes > 64",
    "not_a_map-list": "list",
    "not_a_map-int": "int",
    "not_a_map-str": "str",
    "schema_version-one": "got 1, this build speaks 9" + PEER,
    "schema_version-missing": "got None, this build speaks 9" + PEER,
    "schema_version-bool": "got True, this build speaks 9" + PEER,
    "schema_version-float": "got 1.0, this build speaks 9" + PEER,
    "schema_version-str": "got '1', this build speaks 9" + PEER,
    "unknown_kind-name": "",
    "unknown_kind-missing": "",
    "unknown_kind-bytes": "",
    "unknown_kind-list": "",
    "unknown_kind-map": "",
    "unknown_field-top": "Register: ['extra']",
    "unknown_field-nested": "Welcome.status.snapshot: ['x']",
    "unknown_field-group": "Group: ['logits']",
    "missing_field-top": "Register.producer_id",
    "missing_field-nested": "Welcome.spec.vocab_size",
    "missing_field-group_array": "Group.rewards",
    "bad_type-bool_for_int": "Register.req: expected int",
    "bad_type-float_for_int": "Register.pid: expected int",
    "bad_type-str_for_int": "FileChunkRequest.offset: expected int",
    "bad_type-bool_in_list": "Goodbye.held_leases[]: expected int",
    "bad_type-int_for_list": "Goodbye.held_leases is not a list",
    "bad_type-str_for_bytes": "FetchPlan.chunk_hashes: expected bytes",
    "bad_type-list_for_bytes": "Group.completion_ids: expected raw bytes",
    "bad_type-bool_for_group_int": "Group.lease_id: expected int",
    "bad_type-str_for_float": "Group.temperature: expected float",
    "bad_type-nested_wrong": "Welcome.status.snapshot.version: expected int",
    "bad_type-nested_not_a_map": "StatusReply.status is not a map",
    "bad_type-list_item_not_a_map": "LeaseGrant.leases[] is not a map",
    "bad_type-counter_is_str": "Heartbeat.counters is not a map of str to numbers",
    "bad_type-counter_bool": "Heartbeat.counters is not a map of str to numbers",
    "bad_type-counter_bytes_key": "Heartbeat.counters is not a map of str to numbers",
    "bad_array-ids_not_whole_int32": "Group.completion_ids: 7 bytes is not a multiple of int32",
    "bad_array-rewards_not_whole_f32": "Group.rewards: 6 bytes is not a multiple of float32",
    "group_size-three_for_two": "3 completions, the run samples G=2",
    "length_mismatch-lens_sum_vs_ids": "sum(completion_lens) != len(completion_ids)",
    "length_mismatch-logprobs_vs_ids": "len(logprobs) != the number of sampled tokens",
    "length_mismatch-token_versions": "token_versions must be empty or one per sampled token",
    "length_mismatch-rewards_vs_g": "completion_lens, rewards and finish_reasons differ",
    "length_mismatch-finish_reasons": "completion_lens, rewards and finish_reasons differ",
    "length_mismatch-no_completions": "completion_lens, rewards and finish_reasons differ",
    "bad_length-empty_completion": "a completion is empty or longer than max_new_tokens",
    "bad_length-negative_length": "a completion is empty or longer than max_new_tokens",
    "bad_length-completion_too_long": "a completion is empty or longer than max_new_tokens",
    "bad_length-empty_prompt": "prompt has 0 tokens",
    "bad_length-prompt_too_long": "prompt has 9 tokens",
    "token_out_of_range-negative": "negative token id -1",
    "token_out_of_range-equal_to_vocab": "token id 16 >= vocab 16",
    "token_out_of_range-prompt": "token id 99 >= vocab 16",
    "token_out_of_range-negative_no_vocab": "negative token id -5",
    "bad_logprob-nan": "behaviour log-probs must be finite and <= 0",
    "bad_logprob-plus_inf": "behaviour log-probs must be finite and <= 0",
    "bad_logprob-minus_inf": "behaviour log-probs must be finite and <= 0",
    "bad_logprob-positive": "behaviour log-probs must be finite and <= 0",
    "bad_reward-nan": "rewards must be finite",
    "bad_reward-inf": "rewards must be finite",
    "bad_reward-part_nan": "reward_parts must be finite",
    "length_mismatch-parts_not_f_by_g": "reward_parts holds 3 scores, not F x G (G = 2, F = None)",
    "length_mismatch-parts_of_more_fns": "reward_parts holds 4 scores, not F x G (G = 2, F = 1)",
    "bad_value-finish_reason": (
        "finish_reasons must be in ('stop', 'length', 'abort', 'max_turns', 'max_tokens', "
        "'env_error')"
    ),
    "bad_value-behavior_version_not_min": "behavior_version must equal min(token_versions)",
    "bad_value-behavior_version_below_min": "behavior_version must equal min(token_versions)",
    "bad_value-negative_version": "negative version, lease id or counter",
    "bad_value-negative_lease_id": "negative version, lease id or counter",
    "bad_value-negative_counter": "negative version, lease id or counter",
    "bad_value-zero_temperature": "temperature must be finite and > 0",
    "bad_value-nan_temperature": "temperature must be finite and > 0",
    "sampling_mismatch-temperature": "temperature 1.0 != 0.75",
    "sampling_mismatch-kept_sets_missing": "the run samples truncated: kept sets are missing",
    "sampling_mismatch-kept_sets_unasked": "kept sets in a run without truncated sampling",
    "bad_kept_set-counts_short": "kept sets: one count per token, the counts summing to "
    "len(kept_ids)",
    "bad_kept_set-counts_past_ids": "kept sets: one count per token, the counts summing to "
    "len(kept_ids)",
    "bad_kept_set-counts_short_of_ids": "kept sets: one count per token, the counts summing to "
    "len(kept_ids)",
    "bad_kept_set-counts_at_their_widest": "kept sets: one count per token, the counts summing "
    "to len(kept_ids)",
    "bad_kept_set-id_equal_to_vocab": "kept id 16 out of range",
    "bad_kept_set-negative_id": "kept id -1 out of range",
    "bad_kept_set-not_ascending": "each kept set must be ascending, without repeats",
    "bad_kept_set-an_id_twice": "each kept set must be ascending, without repeats",
    "bad_kept_set-sampled_token_again": "a kept set lists its sampled token again",
    "bad_kept_set-over_max_kept": "a kept set of 5 ids > max_kept 4",
    "bad_kept_set-unknown_out_of_range": "kept_unknown must be ascending token indices",
    "bad_kept_set-unknown_with_ids": "a token whose kept set is unknown lists kept ids",
    "bad_kept_set-ids_without_offsets": "kept ids without offsets",
    "bad_array-kept_ids_not_whole_int32": "Group.kept_ids: 11 bytes is not a multiple of int32",
    "not_msgpack-truncated": "truncated",
    "not_msgpack-truncated_header": "truncated",
    "not_msgpack-random_bytes": "trailing data after the message",
    "not_msgpack-trailing_data": "trailing data after the message",
    "not_msgpack-reserved_byte": "reserved byte 0xc1",
    "not_msgpack-empty": "truncated",
    "not_msgpack-ext_type": "an ext type",
    "not_msgpack-ext_type_of_one_byte_in_a_body": "an ext type",
    "not_msgpack-int_map_key": "a map key of type int",
    "not_msgpack-nesting_too_deep": "nested deeper than 32",
    "not_msgpack-deep_schema_value": "nested deeper than 32",
    "not_msgpack-too_many_values": "more than 60 values",
    "duplicate_key-top": "message: 'schema'",
    "duplicate_key-nested": "Announce.snapshot: 'version'",
    "duplicate_key-counter": "Heartbeat.counters: 'a'",
    "over_budget-tiny_counters": "decoding would allocate more than the message allows",
    "bad_value-lease_with_text_and_messages": ONE_PROMPT,
    "bad_value-lease_without_a_prompt": ONE_PROMPT,
    "bad_value-chat_message_without_a_role": "a chat message without a role",
    "bad_value-columns_not_an_object": "a lease's columns must be a JSON object",
    "bad_type-columns_as_a_map": "LeaseGrant.leases[].columns: expected str",
    "bad_type-chat_message_as_text": "LeaseGrant.leases[].messages[] is not a map",
}


@pytest.mark.parametrize(
    ("reason", "data", "limits"),
    [pytest.param(r, data, limits, id=f"{r}-{name}") for r, name, data, limits in REJECTIONS],
)
def test_bad_message_is_rejected_with_its_reason(reason, data, limits, request):
    with pytest.raises(WireError) as info:
        wire.decode(data, limits)
    assert info.value.reason == reason
    assert info.value.detail == DETAILS[request.node.callspec.id]
    assert str(info.value) == (f"{reason}: {info.value.detail}" if info.value.detail else reason)


def test_every_rejection_case_has_its_detail_written_down():
    assert {f"{r}-{name}" for r, name, *_ in REJECTIONS} == set(DETAILS)


def test_every_reason_that_decode_can_raise_has_a_rejection_case():
    import inspect
    import os
    import re

    if "MUTANT_UNDER_TEST" in os.environ:  # set by mutmut, also for its clean run
        pytest.skip("reads the wire's source text, which a mutation run rewrites")

    from common.wire import reader

    modules = (wire, wire.codec, wire.messages, reader)
    source = "".join(inspect.getsource(m) for m in modules)
    raised = set(re.findall(r'WireError\(\s*"(\w+)"', source))
    tested = {reason for reason, *_ in REJECTIONS} | {reason for reason, *_ in REPLY_REJECTIONS}
    assert raised | {"not_msgpack"} <= tested


CHUNK = wire.Chunk(req=4, version=3, offset=0, total_bytes=6, data=b"\x00\x01\xfe\xff\n7")
REPLY_REJECTIONS = [
    ("multipart", "head_alone", [wire.encode(MESSAGES["chunk_head"])]),
    ("multipart", "three_frames", [*wire.encode_chunk(CHUNK), b""]),
    ("multipart", "no_frames", []),
    ("unexpected_kind", "data_after_a_reject", [wire.encode(MESSAGES["reject"]), b"x"]),
    ("length_mismatch", "data_shorter_than_its_head", [wire.encode_chunk(CHUNK)[0], b"\x00"]),
    ("not_msgpack", "head_is_garbage", [b"\xc1", b"x"]),
]


def test_a_chunk_reply_is_a_head_and_its_bytes_and_the_bytes_are_not_copied():
    frames = [memoryview(f) for f in wire.encode_chunk(CHUNK)]
    assert wire.decode(frames[0]) == MESSAGES["chunk_head"]
    got = wire.decode_reply(frames)
    assert got == CHUNK
    assert isinstance(got, wire.Chunk)
    assert got.data is frames[1]
    reject = MESSAGES["reject"]
    assert wire.decode_reply([memoryview(wire.encode(reject))]) == reject


@pytest.mark.parametrize(
    ("reason", "frames"),
    [pytest.param(r, f, id=f"{r}-{name}") for r, name, f in REPLY_REJECTIONS],
)
def test_a_malformed_chunk_reply_is_refused_with_its_reason(reason, frames):
    with pytest.raises(WireError) as exc:
        wire.decode_reply([memoryview(f) for f in frames])
    assert exc.value.reason == reason


def test_the_samples_pass_the_checks_the_rejection_cases_break():
    assert_same(wire.decode(wire.encode(group()), RUN), group())
    assert_same(
        wire.decode(wire.encode(group(temperature=1.0)), wire.Limits()), group(temperature=1.0)
    )


def test_a_memoryview_decodes_like_bytes():
    data = wire.encode(group())
    assert_same(wire.decode(memoryview(data), RUN), group())


HUGE_HEADERS = {
    "array32": b"\xdd\x80\x00\x00\x00",
    "map32": b"\xdf\x80\x00\x00\x00",
    "bin32": b"\xc6\x80\x00\x00\x00",
    "str32": b"\xdb\x80\x00\x00\x00",
}


@pytest.mark.parametrize("where", ["top_level", "inside_a_group"])
@pytest.mark.parametrize("header", sorted(HUGE_HEADERS))
def test_a_huge_declared_length_is_refused_without_allocating(header, where):
    prefix = GROUP_BODY_PREFIX if where == "inside_a_group" else b""
    data = prefix + HUGE_HEADERS[header] + b"\x00" * 32  # claims 2**31 items in ~80 bytes
    generous = wire.Limits(max_message_bytes=1 << 40, max_items=1 << 40)
    tracemalloc.start()
    try:
        with pytest.raises(WireError) as info:
            wire.decode(data, generous)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.reason == "not_msgpack"
    assert peak < 1 << 20


def test_a_group_error_names_the_lease_and_producer_it_came_from():
    with pytest.raises(WireError) as info:
        wire.decode(wire.encode(group(behavior_logp=[-0.5, math.nan, -2.0])), RUN)
    assert (info.value.lease_id, info.value.producer_id) == (7, "p0")
    with pytest.raises(WireError) as info:  # failed while building, after the ids parsed
        wire.decode(edited(group(), "completion_ids", value=[4, 5, 6]), RUN)
    assert (info.value.lease_id, info.value.producer_id) == (7, "p0")


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(edited(group(), "lease_id", value=True), id="lease_id_is_bool"),
        pytest.param(edited(group(), "producer_id", value=5), id="producer_id_is_int"),
        pytest.param(edited(MESSAGES["register"], "req", value=True), id="not_a_group"),
        pytest.param(b"\xc1", id="not_msgpack"),
    ],
)
def test_an_error_without_trustworthy_ids_carries_none(data):
    with pytest.raises(WireError) as info:
        wire.decode(data, RUN)
    assert (info.value.lease_id, info.value.producer_id) == (None, None)


# ---------------------------------------------------------------------------------------------
# The edges of the contract: legal boundary values are accepted, optional fields may be omitted

# A run with a small vocabulary and short sequences, so that the strategies hit the edges often.
EDGE_RUN = wire.Limits(
    vocab_size=50, group_size=3, temperature=0.7, max_prompt_tokens=6, max_completion_tokens=5
)
PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(g=groups(EDGE_RUN))
def test_every_legal_group_is_accepted_and_round_trips(g):
    data = wire.encode(g)
    decoded = wire.decode(data, EDGE_RUN)
    assert_same(decoded, g)
    assert wire.encode(decoded) == data
    assert wire.decode(data, dataclasses_replace(EDGE_RUN, max_message_bytes=len(data))) is not None


@PROPERTY
@given(g=groups(EDGE_RUN), data=st.data())
def test_a_legal_group_with_one_completion_emptied_is_refused(g, data):
    """Every completion has at least one token (the engine's stop token counts)."""
    i = data.draw(st.integers(0, g.group_size - 1))
    start = int(g.completion_lens[:i].sum())
    keep = np.r_[0:start, start + int(g.completion_lens[i]) : g.num_tokens]
    lens = g.completion_lens.copy()
    lens[i] = 0
    empty = dataclasses_replace(
        g, completion_ids=g.completion_ids[keep], behavior_logp=g.behavior_logp[keep],
        completion_lens=lens, token_versions=g.token_versions[keep] if g.token_versions.size else
        g.token_versions, behavior_version=int(g.token_versions[keep].min())
        if g.token_versions.size and keep.size else g.behavior_version,
    )  # fmt: skip
    with pytest.raises(WireError) as info:
        wire.decode(wire.encode(empty), EDGE_RUN)
    assert info.value.reason == "bad_length"


@PROPERTY
@given(msg=messages(EDGE_RUN))
def test_every_message_round_trips(msg):
    assert_same(wire.decode(wire.encode(msg), EDGE_RUN), msg)


@PROPERTY
@given(data=st.data(), msg=messages(EDGE_RUN))
def test_a_peer_that_omits_optional_fields_is_understood_with_their_defaults(data, msg):
    raw, expected = data.draw(omitting_optional(msg))
    assert_same(wire.decode(raw, EDGE_RUN), expected)


def dataclasses_replace(obj: typing.Any, **changes: typing.Any) -> typing.Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)


MODEL_FILES = (wire.ModelFile("config.json", 612, "ab" * 32),)
SPEC_OPTIONALS = dataclasses_replace(
    SPEC,
    eval_samples=4,
    eval_temperature=0.5,
    model_files=MODEL_FILES,
    episodes=wire.EpisodeSpec("guess", 3, 64, 5.0, 0.0, 1.5),
)


# Every field an older peer may leave out, with the value it then has. Adding a default to a field
# or removing one changes who can talk to whom: this table is the record of that decision.
OPTIONAL = {
    (wire.Register, "held_leases"): (),
    (wire.Heartbeat, "counters"): {},
    (wire.Goodbye, "held_leases"): (),
    (wire.Status, "acks"): (),
    (wire.Status, "finished"): False,
    (wire.Group, "num_reward_errors"): 0,
    (wire.Group, "gen_s"): 0.0,
    (wire.Group, "evaluation"): False,
    (wire.Group, "env_s"): 0.0,
    (wire.RunSpec, "eval_samples"): 1,
    (wire.RunSpec, "eval_temperature"): 1.0,
    (wire.RunSpec, "model_files"): (),
    (wire.RunSpec, "episodes"): None,
    (wire.Lease, "eval_version"): -1,
    (wire.LeaseRequest, "declined"): (),
    (wire.LeaseRequest, "max_eval_leases"): 0,
    (wire.LeaseRequest, "wait_s"): 0.0,
    (wire.Status, "eval_version"): -1,
    (wire.Status, "eval_from"): -1,
    (wire.Status, "heartbeat_s"): 1.0,
}
WHERE = {  # a message holding each optional field (not at its default), and the path to its map
    wire.Register: (MESSAGES["register"], ()),
    wire.Heartbeat: (MESSAGES["heartbeat"], ()),
    wire.Goodbye: (MESSAGES["goodbye"], ()),
    wire.Status: (
        wire.Welcome(1, SPEC, wire.Status("r", 3, None, STATUS.acks, True, 2, 1, 16.0)),
        ("status",),
    ),
    wire.Group: (group(num_reward_errors=1, evaluation=True, env_s=0.5), ()),
    wire.RunSpec: (
        wire.Welcome(1, SPEC_OPTIONALS, STATUS),
        ("spec",),
    ),
    wire.Lease: (
        wire.LeaseGrant(2, (dataclasses_replace(LEASE, eval_version=3),), STATUS),
        ("leases", 0),
    ),
    wire.LeaseRequest: (wire.LeaseRequest(3, "p0", 4, 3, ((1 << 62) | 7,), 2, 64.0), ()),
}


def _at(obj: typing.Any, key: str | int) -> typing.Any:
    return obj[key] if isinstance(key, int) else getattr(obj, key)


def test_the_optional_fields_are_exactly_those_listed():
    import dataclasses

    classes = {c for c in vars(wire).values() if dataclasses.is_dataclass(c)} - {wire.Limits}
    found = {(c, name) for c in classes for name in optional_fields(c)}
    # the kept sets: left out exactly when empty (an untruncated group), refused when missing
    # from a truncated run's group (sampling_mismatch)
    assert found == set(OPTIONAL) | {(wire.Group, name) for name in wire.Group.OMIT_EMPTY}


@pytest.mark.parametrize(
    ("cls", "name"), sorted(OPTIONAL, key=lambda k: (k[0].__name__, k[1])),
    ids=lambda v: getattr(v, "__name__", v),
)  # fmt: skip
def test_an_optional_field_left_out_decodes_to_its_default(cls, name):
    msg, path = WHERE[cls]
    sample = msg
    for key in path:
        sample = _at(sample, key)
    assert getattr(sample, name) != OPTIONAL[cls, name]  # the sample sends a non-default value
    limits = RUN if cls is wire.Group else wire.Limits()
    decoded = wire.decode(without(msg, *path, name), limits)
    inner = decoded
    for key in path:
        inner = _at(inner, key)
    assert getattr(inner, name) == OPTIONAL[cls, name]
    assert type(getattr(inner, name)) is type(OPTIONAL[cls, name])
    for key in {f for c, f in OPTIONAL if c is cls} - {name}:  # the others as sent
        assert getattr(inner, key) == getattr(sample, key)


def test_a_peer_that_sends_no_optional_field_at_all_is_understood():
    body = body_of(MESSAGES["welcome"])
    del body["status"]["acks"], body["status"]["finished"]
    status = wire.decode(pack(body)).status
    assert (status.acks, status.finished) == ((), False)
    body = body_of(group())
    del body["num_reward_errors"], body["gen_s"]
    g = wire.decode(pack(body), RUN)
    assert (g.num_reward_errors, g.gen_s) == (0, 0.0)
    assert g.rewards.tolist() == [1.0, 0.0]


@pytest.mark.parametrize("field", ["prompt_ids", "completion_ids"])
def test_token_ids_zero_and_vocab_minus_one_are_legal(field):
    for ids in ([0, 0, 0], [15, 15, 15], [0, 15, 0]):  # RUN's vocabulary is 16
        msg = group(**{field: ids})
        assert getattr(wire.decode(wire.encode(msg), RUN), field).tolist() == ids
    no_vocab = wire.Limits()  # without a run, ids up to int32's maximum are legal
    msg = group(**{field: [0, 2**31 - 1, 0]})
    assert getattr(wire.decode(wire.encode(msg), no_vocab), field).tolist() == [0, 2**31 - 1, 0]


@pytest.mark.parametrize("value", EDGE_LOGPROBS, ids=repr)
def test_a_behaviour_logprob_at_the_edge_of_the_legal_range_is_accepted(value):
    msg = group(behavior_logp=[value, -1.0, value])
    got = wire.decode(wire.encode(msg), RUN).behavior_logp
    assert got.tolist() == np.array([value, -1.0, value], np.float32).tolist()


def test_a_log_prob_of_exactly_zero_is_accepted_everywhere_in_a_group():
    assert wire.decode(wire.encode(group(behavior_logp=[0.0, 0.0, 0.0])), RUN).num_tokens == 3
    assert F32_LOWEST < -3e38


def test_a_message_of_exactly_max_message_bytes_is_accepted_and_one_byte_more_is_not():
    data = wire.encode(group())
    exact = wire.Limits(**{**_limits_fields(RUN), "max_message_bytes": len(data)})
    assert_same(wire.decode(data, exact), group())
    short = wire.Limits(**{**_limits_fields(RUN), "max_message_bytes": len(data) - 1})
    with pytest.raises(WireError) as info:
        wire.decode(data, short)
    assert info.value.reason == "too_large"
    assert info.value.detail == f"{len(data)} bytes > {len(data) - 1}"


def test_a_list_of_exactly_max_items_is_accepted_and_one_more_is_not():
    limits = wire.Limits(max_items=8)
    eight = wire.Goodbye(req=1, producer_id="p", held_leases=tuple(range(8)))
    assert wire.decode(wire.encode(eight), limits) == eight
    nine = wire.Goodbye(req=1, producer_id="p", held_leases=tuple(range(9)))
    with pytest.raises(WireError) as info:
        wire.decode(wire.encode(nine), limits)
    assert info.value.reason == "not_msgpack"


def test_a_map_of_exactly_max_items_is_accepted():
    counters = {f"c{i}": float(i) for i in range(8)}  # the heartbeat's body is a map of 7
    msg = wire.Heartbeat(1, "p", 0, "idle", 0, counters=counters)
    assert wire.decode(wire.encode(msg), wire.Limits(max_items=8)) == msg
    with pytest.raises(WireError):
        wire.decode(wire.encode(msg), wire.Limits(max_items=7))


def test_strings_and_bytes_as_long_as_the_message_allows_are_accepted():
    plan = dataclasses.replace(MESSAGES["fetch_plan"], chunk_hashes=b"\xff" * 100)
    data = wire.encode(plan)
    assert wire.decode(data, wire.Limits(max_message_bytes=len(data))) == plan
    reject = wire.Reject(req=1, reason="r" * 100, detail="")
    data = wire.encode(reject)
    assert wire.decode(data, wire.Limits(max_message_bytes=len(data))) == reject


def test_a_prompt_and_completions_of_exactly_the_maximal_length_are_accepted():
    msg = group(
        prompt_ids=[1] * 8, completion_ids=[4] * 8, completion_lens=[4, 4],
        behavior_logp=[-1.0] * 8,
    )  # fmt: skip
    got = wire.decode(wire.encode(msg), RUN)  # RUN: max_prompt_tokens 8, max_completion_tokens 4
    assert (len(got.prompt_ids), got.completion_lens.tolist()) == (8, [4, 4])
    one = group(prompt_ids=[1], completion_ids=[4, 5], completion_lens=[1, 1],
                behavior_logp=[-1.0, -1.0])  # fmt: skip
    assert wire.decode(wire.encode(one), RUN).completion_lens.tolist() == [1, 1]


def test_an_integer_where_a_float_is_declared_is_taken_as_that_float():
    """Other msgpack packers write 1.0 as 1; a float field takes any int (never a bool)."""
    data = edited(MESSAGES["welcome"], "spec", "heartbeat_s", value=2)
    spec = wire.decode(data).spec
    assert (spec.heartbeat_s, type(spec.heartbeat_s)) == (2.0, float)
    g = wire.decode(edited(group(), "gen_s", value=3), RUN)
    assert (g.gen_s, type(g.gen_s)) == (3.0, float)
    with pytest.raises(WireError, match="expected float"):
        wire.decode(edited(group(), "gen_s", value=True), RUN)


def test_unknown_fields_are_named_three_at_most():
    body = body_of(MESSAGES["register"])
    body.update({"w": 1, "x": 2, "y": 3, "z": 4})
    with pytest.raises(WireError) as info:
        wire.decode(pack(body))
    assert info.value.detail == "Register: ['w', 'x', 'y']"


def test_decoding_derives_the_type_hints_of_a_kind_once(monkeypatch):
    """Hints are read once per message class, not per message (decode is the hot path)."""
    import typing as typing_module

    for kind, msg in MESSAGES.items():  # every class seen once
        wire.decode(wire.encode(msg), RUN if kind == "group" else wire.Limits())
    calls = []
    real = typing_module.get_type_hints
    monkeypatch.setattr(
        typing_module, "get_type_hints", lambda *a, **k: calls.append(a) or real(*a, **k)
    )
    for kind, msg in MESSAGES.items():
        wire.decode(wire.encode(msg), RUN if kind == "group" else wire.Limits())
    assert calls == []


def test_without_a_run_a_group_of_any_size_from_one_is_legal():
    """The run decides G (the consumer always sets it); the wire alone only needs one."""
    one = group(completion_ids=[4], completion_lens=[1], behavior_logp=[-1.0], rewards=[1.0],
                finish_reasons=("stop",))  # fmt: skip
    assert wire.decode(wire.encode(one), wire.Limits()).group_size == 1
    with pytest.raises(WireError, match="group_size"):
        wire.decode(wire.encode(one), RUN)


def test_behavior_version_zero_and_equal_to_the_oldest_token_are_legal():
    g = wire.decode(wire.encode(group(behavior_version=0, token_versions=[0, 0, 1])), RUN)
    assert (g.behavior_version, g.token_versions.tolist()) == (0, [0, 0, 1])
    g = wire.decode(wire.encode(group(lease_id=0, num_reward_errors=0)), RUN)
    assert (g.lease_id, g.num_reward_errors) == (0, 0)


@pytest.mark.parametrize(
    ("temperature", "accepted"),
    [(0.75, True), (0.75 * (1 + 5e-7), True), (0.75 * (1 - 5e-7), True),
     (0.75 * (1 + 2e-6), False), (0.75 * (1 - 2e-6), False)],
)  # fmt: skip
def test_the_temperature_must_match_the_run_to_a_relative_1e_minus_6(temperature, accepted):
    data = wire.encode(group(temperature=temperature))
    if accepted:
        assert wire.decode(data, RUN).temperature == temperature
    else:
        with pytest.raises(WireError, match="sampling_mismatch"):
            wire.decode(data, RUN)


def test_a_tiny_positive_temperature_is_legal_without_a_run():
    g = wire.decode(wire.encode(group(temperature=1e-300)), wire.Limits())
    assert g.temperature == 1e-300


def _limits_fields(limits: wire.Limits) -> dict[str, typing.Any]:
    import dataclasses

    return {f.name: getattr(limits, f.name) for f in dataclasses.fields(limits)}


# ---------------------------------------------------------------------------------------------
# Fuzzing: only WireError may escape


ENCODED = [wire.encode(m) for m in MESSAGES.values()] + [
    wire.encode(group(token_versions=[2, 3, 3]))
]
FUZZ_LIMITS = [wire.Limits(), RUN, wire.Limits(max_message_bytes=256, max_items=8)]


def decode_or_reject(data: bytes, limits: wire.Limits) -> None:
    """Decode `data`; a `WireError` with a reason is fine, any other exception fails the test."""
    msg: typing.Any = None
    reason = ""
    try:
        msg = wire.decode(data, limits)
    except WireError as exc:
        reason = exc.reason
    if msg is None:
        assert reason
    else:
        assert type(msg) in KINDS.values()


@st.composite
def mutations(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(ENCODED)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "overwrite"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=9))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 9))]
        elif op == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=9))
            data[pos : pos + len(chunk)] = chunk
    return bytes(data)


MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=6)
    | st.binary(max_size=13),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def type_confusions(draw: st.DrawFn) -> bytes:
    """A valid body with one entry (at any depth of maps) replaced by an arbitrary value."""
    body = body_of(draw(st.sampled_from(list(MESSAGES.values()))))
    node = body
    while True:
        key = draw(st.sampled_from(sorted(node)))
        if isinstance(node[key], dict) and node[key] and draw(st.booleans()):
            node = node[key]
            continue
        node[key] = draw(MSGPACK_VALUES)
        return pack(body)


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(data=st.binary(max_size=600), limits=st.sampled_from(FUZZ_LIMITS))
def test_random_bytes_raise_only_wire_error(data, limits):
    decode_or_reject(data, limits)


@FUZZ
@given(data=mutations(), limits=st.sampled_from(FUZZ_LIMITS))
def test_mutated_messages_raise_only_wire_error(data, limits):
    decode_or_reject(data, limits)


@FUZZ
@given(data=type_confusions(), limits=st.sampled_from(FUZZ_LIMITS))
def test_values_of_the_wrong_type_raise_only_wire_error(data, limits):
    decode_or_reject(data, limits)


# ---------------------------------------------------------------------------------------------
# Schema 7: the heartbeat period travels in every status


def test_a_schema_8_peer_is_refused_with_one_line_naming_both_versions():
    body = body_of(MESSAGES["heartbeat"])
    body["schema"] = 8
    with pytest.raises(WireError) as info:
        wire.decode(pack(body), wire.Limits())
    assert info.value.reason == "schema_version"
    assert info.value.detail == f"got 8, this build speaks {wire.SCHEMA_VERSION}" + PEER
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind", ["status", "welcome", "lease_grant"])
def test_the_heartbeat_period_a_status_carries_round_trips(kind):
    msg = dataclasses.replace(MESSAGES[kind], status=dataclasses.replace(STATUS, heartbeat_s=16.5))
    assert wire.decode(wire.encode(msg), wire.Limits()).status.heartbeat_s == 16.5


@pytest.mark.parametrize("period", [0.0, -1.0, math.inf, math.nan])
def test_a_status_whose_heartbeat_period_is_not_a_positive_number_is_refused(period):
    msg = wire.StatusReply(1, dataclasses.replace(STATUS, heartbeat_s=period))
    with pytest.raises(WireError, match="heartbeat_s must be positive and finite"):
        wire.decode(wire.encode(msg), wire.Limits())


@pytest.mark.parametrize("wait", [-1.0, wire.MAX_LEASE_WAIT_S + 1, math.inf, math.nan])
def test_a_lease_request_whose_wait_is_not_in_range_is_refused(wait):
    msg = dataclasses.replace(MESSAGES["lease_req"], wait_s=wait)
    with pytest.raises(WireError, match=r"wait_s must be in \[0, 600\] s"):
        wire.decode(wire.encode(msg), wire.Limits())


# ---------------------------------------------------------------------------------------------
# Schema 8: a group names its first failed reward call


def test_a_groups_reward_error_round_trips_and_costs_nothing_when_empty():
    group = MESSAGES["group"]
    assert group.reward_error == ""
    assert "reward_error" not in msgpack.unpackb(wire.encode(group))  # left out: bytes as in v7
    failing = dataclasses.replace(group, reward_error="reward 'r:f' raised IndexError: x")
    back = wire.decode(wire.encode(failing), wire.Limits())
    assert isinstance(back, wire.Group)
    assert back.reward_error == "reward 'r:f' raised IndexError: x"


def test_a_reward_error_longer_than_its_bound_is_refused():
    long = "x" * (wire.MAX_REWARD_ERROR_CHARS + 1)
    failing = dataclasses.replace(MESSAGES["group"], reward_error=long)
    with pytest.raises(WireError) as info:
        wire.decode(wire.encode(failing), wire.Limits())
    assert info.value.reason == "bad_length"
