"""The largest messages the protocol makes at the largest settings the config accepts decode, by
the limits their receivers use, within the decoder's memory bound (common/wire/sizes.py).

A grant of >= 255 leases with short prompts, and registrations and goodbyes of 1,024 held lease
ids, were once refused as `over_budget`: their lists cost more objects per byte than the budget
allowed, and training stalled. The limits of both ends of the control channel allow for them
(`wire.reply_limits`, `wire.control_limits`), and the config refuses the settings whose messages
would not fit (common/config/tree.py).
"""

from __future__ import annotations

import tracemalloc

import pytest

from common import config as C
from common import wire
from common.errors import ConfigError

INCARNATIONS = [0, 1]  # lease ids of 1-3 bytes, and of 9 bytes (incarnation << 40 | n)
LARGEST = wire.MAX_LEASE_IDS  # the most leases the config lets a producer hold (test below)


def decoded_within_bound(msg: wire.Message, limits: wire.Limits) -> wire.Message:
    """`msg` encoded and decoded by `limits`, checked to be the same; for messages under 64 KiB,
    within the bound too (tracemalloc slows decoding ~10x; tests/unit/test_wire_fuzz.py
    measures the bound at large)."""
    data = wire.encode(msg)
    if len(data) >= 64 << 10:
        got = wire.decode(data, limits)
    else:
        tracemalloc.start()
        try:
            got = wire.decode(data, limits)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak <= wire.alloc_bound(len(data), limits), (len(data), peak)
    assert got == msg
    return got


def grant(
    num_leases: int, incarnation: int, *, num_acks: int = wire.ACKS_PER_REPLY, chat: bool = False
):
    """A grant as the default task makes them: 6-character prompts, short answers; with `chat`,
    each prompt as two short chat turns (a system and a user one) and a small row of columns."""
    leases = tuple(
        wire.Lease(
            (incarnation << 40) | (300 + i), 5000 + i, 7, 6, f"{i % 90 + 10}+17=", "9", (), ""
        )
        if not chat
        else wire.Lease(
            (incarnation << 40) | (300 + i),
            5000 + i,
            7,
            6,
            "",
            "9",
            (wire.ChatTurn("system", "Be brief."), wire.ChatTurn("user", f"{i % 90 + 10}+17=")),
            '{"unit":"cm"}',
        )
        for i in range(num_leases)
    )
    acks = tuple(
        wire.Ack((incarnation << 40) | i, "dropped_zero_variance") for i in range(num_acks)
    )
    snapshot = wire.SnapshotInfo(7, 1 << 30, "ab" * 32, "/runs/r/snapshots/v000007/m")
    return wire.LeaseGrant(3, leases, wire.Status("0f1e2d3c-1", 7, snapshot, acks, False))


def held(num_ids: int, incarnation: int) -> tuple[int, ...]:
    return tuple((incarnation << 40) | (256 + i) for i in range(num_ids))


@pytest.mark.parametrize("incarnation", INCARNATIONS)
@pytest.mark.parametrize("max_in_flight", [1, 255, 300, 1024, 4096, LARGEST])
def test_the_largest_grant_a_producer_can_be_sent_decodes(max_in_flight, incarnation):
    limits = wire.reply_limits(64 << 20, max_in_flight)
    num_leases = min(max_in_flight, wire.MAX_LEASES_PER_GRANT)
    decoded_within_bound(grant(num_leases, incarnation), limits)
    decoded_within_bound(grant(num_leases, incarnation, chat=True), limits)
    decoded_within_bound(wire.largest_grant(max_in_flight), limits)


@pytest.mark.parametrize("incarnation", INCARNATIONS)
@pytest.mark.parametrize("num_ids", [1, 255, 1024, 4096, LARGEST])
def test_registrations_and_goodbyes_naming_every_held_lease_decode(num_ids, incarnation):
    limits = wire.control_limits()
    ids = held(num_ids, incarnation)
    decoded_within_bound(wire.Register(9, "gpu-host-17", "gpu-host", 4242, "vllm", 6, ids), limits)
    decoded_within_bound(wire.Goodbye(10, "gpu-host-17", ids), limits)
    decoded_within_bound(wire.largest_register(num_ids), limits)


def test_ids_of_one_byte_the_densest_list_decode_too():
    ids = tuple(range(100)) * (wire.MAX_LEASE_IDS // 100)  # positive fixints: 16 bytes per byte
    decoded_within_bound(wire.Goodbye(1, "p", ids), wire.control_limits())


def test_a_grant_of_1024_leases_and_a_registration_of_1024_ids_round_trip():
    big = grant(1024, 0)
    assert decoded_within_bound(big, wire.reply_limits(64 << 20, 1024)).leases == big.leases
    ids = held(1024, 0)
    register = wire.Register(1, "p", "h", 1, "fake", 0, ids)
    assert decoded_within_bound(register, wire.control_limits()).held_leases == ids


@pytest.mark.parametrize("n", [0, 1, 15, 16, 255, 1024, 1025, 65535, 65536, 70000])
def test_the_largest_message_bytes_are_those_of_the_largest_messages_encoded(n):
    encoded = max(
        len(wire.encode(wire.largest_grant(n))), len(wire.encode(wire.largest_register(n)))
    )
    assert wire.largest_message_bytes(n) == encoded


def _config(*sets: str) -> C.Config:
    return C.apply_overrides(C.Config(), ["staleness.max_staleness=0", *sets])


def test_the_config_accepts_every_lease_a_registration_can_name_and_not_one_more():
    C.validate(_config(f"producer.max_in_flight={LARGEST}", f"train.prompts_per_step={LARGEST}"))
    with pytest.raises(ConfigError) as err:
        C.validate(
            _config(
                f"producer.max_in_flight={LARGEST + 1}", f"train.prompts_per_step={LARGEST + 1}"
            )
        )
    assert str(err.value).startswith(f"producer.max_in_flight = {LARGEST + 1}")
    assert "\n" not in str(err.value)


def test_either_bound_on_held_leases_is_enough():
    """The consumer keeps at most (max_staleness + 1) x prompts_per_step leases open: a producer
    may set max_in_flight above what a registration carries."""
    C.validate(_config("producer.max_in_flight=1000000", "train.prompts_per_step=1024"))
    with pytest.raises(ConfigError, match=r"\(staleness.max_staleness \+ 1\) x train"):
        C.validate(_config("producer.max_in_flight=1000000", "train.prompts_per_step=70000"))


def test_messages_that_would_not_fit_net_max_message_mib_are_refused_with_what_to_raise():
    sets = ("producer.max_in_flight=1024", "train.prompts_per_step=1024")
    C.validate(_config(*sets))  # the default 64 MiB
    with pytest.raises(ConfigError) as err:
        C.validate(
            _config(*sets, "net.max_message_mib=0.1", "net.max_queued_mib=1", "task.max_row_kib=16")
        )
    message = str(err.value)
    assert message.startswith("net.max_message_mib = 0.1 is too small for producer.max_in_flight")
    assert message.endswith("raise net.max_message_mib above that")
    assert "\n" not in message
    need = wire.largest_message_bytes(1024) / (1 << 20)
    assert f"{need:.3f} MiB" in message
    C.validate(
        _config(
            *sets,
            f"net.max_message_mib={need + 0.001:.3f}",
            "net.max_queued_mib=1",
            "task.max_row_kib=16",
        )
    )


def test_only_the_kinds_that_carry_those_lists_get_their_allowance():
    """A heartbeat of 500 tiny counters (~170 bytes of objects per 5 wire bytes) stays
    over_budget under the control limits: the lease ids' allowance is a registration's and a
    goodbye's, not every message's."""
    costly = wire.Heartbeat(1, "x", 0, "idle", 0, {f"{i:03}": float(i) for i in range(500)})
    data = wire.encode(costly)
    with pytest.raises(wire.WireError, match="over_budget"):
        wire.decode(data, wire.control_limits())
    assert wire.alloc_bound(len(data), wire.control_limits(), wire.Heartbeat) < (
        wire.alloc_bound(len(data), wire.control_limits(), wire.Register)
    )
