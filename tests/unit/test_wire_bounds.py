"""Wire rules that a sampled mutation run of common/wire/codec.py found untested: an evaluation
group's per-token fields, one by one, and the decoder's memory bound pinned to its value for a
few messages (its constants doubled or zeroed must fail here)."""

from __future__ import annotations

import dataclasses
import typing

import numpy as np
import pytest
from test_wire import LEASE, RUN, group

from common import wire
from common.wire import codec
from common.wire import reader as mp


@pytest.mark.parametrize(
    ("field", "values"),
    [
        ("token_versions", np.array([2, 2, 2], np.int32)),
        ("kept_counts", np.array([0, 0, 0], np.uint8)),
        ("kept_ids", np.array([1], np.int32)),
        ("kept_unknown", np.array([0], np.int32)),
    ],
)
def test_an_evaluation_group_with_any_one_per_token_field_is_refused(field, values):
    """Each field alone is enough (the rule is an `or` of four: none may be present)."""
    g = group(evaluation=True, **{field: values})
    with pytest.raises(wire.WireError, match="an evaluation group carries one version") as info:
        wire.check_group(g, RUN)
    assert info.value.reason == "bad_value"
    with pytest.raises(wire.WireError, match="an evaluation group carries one version"):
        wire.decode(wire.encode(g), RUN)
    wire.check_group(group(evaluation=True), RUN)  # the same group without it is fine


def test_the_per_item_allowances_are_their_measured_costs():
    assert codec.LEASE_BYTES == 2 * mp.SLOT_BYTES + mp.fixed_cost(wire.Lease) == 1124
    assert codec.LEASE_ID_BYTES == 2 * mp.SLOT_BYTES + mp.fixed_cost(int) == 52
    assert codec.ACK_BYTES == 2 * mp.SLOT_BYTES + mp.fixed_cost(wire.Ack) == 212
    assert (codec.ALLOC_FACTOR, codec.ALLOC_BASE_BYTES) == (4, 16 << 10)


LIMITS = dataclasses.replace(RUN, max_leases=3, max_lease_ids=5, max_acks=2)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (wire.Heartbeat, 4 * 1000 + 16384),
        (wire.Group, 4 * 1000 + 16384),
        (wire.Register, 4 * 1000 + 16384 + 5 * 52),
        (wire.Goodbye, 4 * 1000 + 16384 + 5 * 52),
        (wire.LeaseRequest, 4 * 1000 + 16384 + 5 * 52),
        (wire.StatusReply, 4 * 1000 + 16384 + 2 * 212),
        (wire.Welcome, 4 * 1000 + 16384 + 2 * 212),
        (wire.LeaseGrant, 4 * 1000 + 16384 + 2 * 212 + 3 * 1124),
        (None, 4 * 1000 + 16384 + 2 * 212 + 3 * 1124),  # any kind: the largest allowance
    ],
)
def test_the_decode_bound_of_a_1000_byte_message_by_kind(kind, expected):
    assert wire.alloc_bound(1000, LIMITS, kind) == expected


def test_decode_starts_every_message_with_the_bound_less_what_is_kept_back(monkeypatch):
    """The reader's first budget is the bound of a kind without allowance, less 4 KiB kept back
    for what is not charged (an exception and its traceback, error texts)."""
    budgets: list[int] = []

    class Recording(mp.Reader):
        def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
            budgets.append(kwargs["budget"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(codec.mp, "Reader", Recording)
    data = wire.encode(group())
    wire.decode(data, RUN)
    assert budgets == [4 * len(data) + 16384 - 4096]


# -- the rules a fuller mutation run of the codec found unpinned ------------------------------
def _refused(reason: str, detail: str, call: typing.Any, *args: typing.Any) -> None:
    with pytest.raises(wire.WireError, match=f"{reason}: {detail}") as info:
        call(*args)
    assert info.value.reason == reason


def test_a_data_reply_of_the_wrong_shape_is_refused_with_what_was_wrong():
    head = wire.encode(wire.ChunkHead(1, 2, 0, 10, 4))
    _refused("multipart", "a chunk head without its data frame", wire.decode_reply, [head])
    _refused("multipart", "3 frames$", wire.decode_reply, [head, b"ab", b"cd"])
    beat = wire.encode(wire.Heartbeat(1, "p", 0, "idle", 0))
    _refused("unexpected_kind", "Heartbeat before a data frame$", wire.decode_reply, [beat, b"x"])
    _refused("length_mismatch", "head says 4 bytes, frame has 2$", wire.decode_reply, [head, b"ab"])
    small = wire.Limits(max_message_bytes=8)  # the reply's limits apply to both shapes
    _refused("too_large", r"\d+ bytes > 8", wire.decode_reply, [beat], small)
    _refused("too_large", r"\d+ bytes > 8", wire.decode_reply, [head, b"abcd"], small)


def test_a_refused_group_names_its_lease_and_producer_only_when_both_parse():
    data = wire.encode(group(temperature=2.0))  # refused: not the run's temperature
    with pytest.raises(wire.WireError) as info:
        wire.decode(data, RUN)
    assert (info.value.lease_id, info.value.producer_id) == (7, "p0")
    body = wire.encode(group(temperature=2.0, producer_id="p0"))
    no_producer = body.replace(b"\xabproducer_id", b"\xabproducer_xx")
    with pytest.raises(wire.WireError) as info:
        wire.decode(no_producer, RUN)
    assert (info.value.lease_id, info.value.producer_id) == (None, None)


@pytest.mark.parametrize("columns", ['{"a": 1', '"a": 1}', "[1]"])
def test_a_leases_columns_must_be_one_json_objects_text(columns):
    lease = dataclasses.replace(LEASE, columns=columns)
    _refused("bad_value", "a lease's columns must be a JSON object", wire.check_lease, lease)


@pytest.mark.parametrize("beat", [0.0, -1.0, float("inf"), float("nan")])
def test_a_status_whose_heartbeat_period_is_not_positive_and_finite_is_refused(beat):
    status = wire.Status("r", 0, None, heartbeat_s=beat)
    _refused(
        "bad_value", "a status's heartbeat_s must be positive and finite", wire.check_status, status
    )


def test_a_lease_request_may_wait_the_longest_wait_and_no_longer():
    longest = wire.LeaseRequest(1, "p", 1, 0, wait_s=wire.MAX_LEASE_WAIT_S)
    codec.check_lease_request(longest)
    longer = dataclasses.replace(longest, wait_s=wire.MAX_LEASE_WAIT_S * 1.001)
    _refused(
        "bad_value",
        r"a lease request's wait_s must be in \[0, 600\] s",
        codec.check_lease_request,
        longer,
    )


EVAL_RUN = dataclasses.replace(RUN, eval_group_size=3, eval_temperature=0.0)


def _eval_group(**changes: typing.Any) -> wire.Group:
    fields: dict[str, typing.Any] = dict(
        completion_ids=[4, 5, 6],
        completion_lens=[1, 1, 1],
        behavior_logp=[-0.5, -1.0, -2.0],
        rewards=[1.0, 0.0, 1.0],
        finish_reasons=("stop",) * 3,
        temperature=0.0,
        evaluation=True,
    )
    return group(**{**fields, **changes})


def test_an_evaluation_group_has_the_evaluations_size_and_temperature():
    wire.check_group(_eval_group(), EVAL_RUN)  # k = 3, greedy: not the run's G = 2 or 0.75
    _refused(
        "group_size",
        "2 completions, the run evaluates k=3",
        wire.check_group,
        group(evaluation=True, temperature=0.0),
        EVAL_RUN,
    )
    _refused(
        "group_size",
        "3 completions, the run samples G=2",
        wire.check_group,
        _eval_group(evaluation=False, temperature=0.75),
        EVAL_RUN,
    )
    _refused(
        "sampling_mismatch",
        "temperature 0.75 != 0.0",
        wire.check_group,
        _eval_group(temperature=0.75),
        EVAL_RUN,
    )
    _refused(
        "bad_value",
        "temperature must be finite and > 0",
        wire.check_group,
        group(temperature=0.0),
        RUN,
    )


def test_reward_parts_hold_at_most_64_scores_per_completion_when_f_is_not_set():
    wire.check_group(group(reward_parts=np.zeros(64 * 2, np.float32)), RUN)
    _refused(
        "length_mismatch",
        "reward_parts holds 130 scores",
        wire.check_group,
        group(reward_parts=np.zeros(65 * 2, np.float32)),
        RUN,
    )


@pytest.mark.parametrize(
    "kept",
    [dict(kept_ids=np.array([1], np.int32)), dict(kept_unknown=np.array([0], np.int32))],
)
def test_any_kept_set_field_alone_is_refused_in_a_run_without_truncation(kept):
    untruncated = dataclasses.replace(RUN, max_kept=0)
    _refused(
        "sampling_mismatch",
        "kept sets in a run without truncated sampling",
        wire.check_group,
        group(**kept),
        untruncated,
    )
