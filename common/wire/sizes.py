"""The lists whose length a run sets, the limits the control channel decodes them with, and the
largest messages they make.

Three lists grow with a run's settings: the leases of a `LeaseGrant`, the lease ids a `Register`
or `Goodbye` names (every lease its producer holds: leases in flight and groups not yet
acknowledged) and the acks of a `Status`. Their bounds:
- a grant holds at most `MAX_LEASES_PER_GRANT` leases (the consumer grants no more in one reply,
  consumer/server/control.py) and no more than its producer asked for (the free slots of its
  `producer.max_in_flight`);
- a status holds at most `ACKS_PER_REPLY` acks (the rest wait for the next reply:
  consumer/server/leases.py);
- the consumer reads a control request of at most `MAX_CONTROL_BYTES` with at most
  `MAX_LEASE_IDS` lease ids (its control socket's list cap): a producer holds at most
  min(`producer.max_in_flight`, (`staleness.max_staleness` + 1) x `train.prompts_per_step`)
  leases at once (the consumer keeps no more open), which common/config/tree.py checks against
  these bounds and `net.max_message_mib` at start (`largest_message_bytes`).

`reply_limits` (what a producer decodes control replies with) and `control_limits` (what the
consumer decodes control requests with) expect those lists, so their items have their
allowance in the decoding budget (common/wire/codec.py `alloc_bound`): the largest messages the
protocol makes at the largest settings the config accepts decode (tests/unit/test_wire_sizes.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from common.wire.codec import Limits, encode
from common.wire.messages import (
    OUTCOMES,
    Ack,
    Lease,
    LeaseGrant,
    Message,
    Register,
    SnapshotInfo,
    Status,
)

MAX_LEASES_PER_GRANT = 1 << 10
ACKS_PER_REPLY = 1 << 10  # ~5 msgpack values each: far below Limits.max_objects
MAX_LEASE_IDS = 1 << 16
MAX_CONTROL_BYTES = 1 << 20
_WIDEST = (1 << 64) - 1  # every int at its widest encoding (9 bytes)
_NAME = "n" * 255  # producer ids and hosts, at a length no real one exceeds
_PATH = "/" * 4096  # the consumer's snapshot path, at PATH_MAX


def reply_limits(max_message_bytes: int, max_in_flight: int) -> Limits:
    """What a producer that holds at most `max_in_flight` leases decodes control replies with."""
    return Limits(
        max_message_bytes=max_message_bytes,
        max_leases=min(max_in_flight, MAX_LEASES_PER_GRANT),
        max_acks=ACKS_PER_REPLY,
    )


def control_limits() -> Limits:
    """What the consumer decodes control requests with: registrations and goodbyes of up to
    `MAX_LEASE_IDS` held leases (values: those ids and the message's own few)."""
    return Limits(
        max_message_bytes=MAX_CONTROL_BYTES,
        max_items=MAX_LEASE_IDS,
        max_objects=2 * MAX_LEASE_IDS,
        max_lease_ids=MAX_LEASE_IDS,
    )


def largest_grant(num_leases: int) -> LeaseGrant:
    """The largest grant of `num_leases` leases (at most `MAX_LEASES_PER_GRANT`) apart from its
    prompts' and answers' text: every int at its widest, `ACKS_PER_REPLY` acks of the longest
    outcome, a snapshot path of PATH_MAX characters."""
    leases = tuple(
        Lease(
            lease_id=_WIDEST,
            prompt_index=_WIDEST,
            step=_WIDEST,
            min_version=_WIDEST,
            prompt="?",
            answer="",
            messages=(),
            columns="",
            eval_version=_WIDEST,
        )
        for _ in range(min(num_leases, MAX_LEASES_PER_GRANT))
    )
    outcome = max(OUTCOMES, key=len)
    acks = tuple(Ack(_WIDEST, outcome) for _ in range(ACKS_PER_REPLY))
    snapshot = SnapshotInfo(version=_WIDEST, num_bytes=_WIDEST, hash="0" * 64, path=_PATH)
    return LeaseGrant(
        _WIDEST,
        leases,
        Status(
            run_id=_NAME,
            policy_version=_WIDEST,
            snapshot=snapshot,
            acks=acks,
            finished=True,
            eval_version=_WIDEST,
            eval_from=_WIDEST,
        ),
    )


def largest_register(num_ids: int) -> Register:
    """The largest registration naming `num_ids` held leases (a goodbye names the same ids in
    fewer fields): every int at its widest, names of 255 characters."""
    return Register(
        req=_WIDEST,
        producer_id=_NAME,
        host=_NAME,
        pid=_WIDEST,
        engine=_NAME,
        loaded_version=_WIDEST,
        held_leases=tuple([_WIDEST] * num_ids),
    )


def largest_message_bytes(num_leases: int) -> int:
    """The bytes of the largest control message when a producer holds `num_leases` leases: its
    registration, or a grant of that many (prompts' and answers' text comes on top). Counted
    from one item of each list (every item has the same widest size), not by encoding them."""
    grant = _with_items(*_item_bytes(largest_grant), min(num_leases, MAX_LEASES_PER_GRANT))
    register = _with_items(*_item_bytes(largest_register), num_leases)
    return max(grant, register)


@functools.cache
def _item_bytes(largest: Callable[[int], Message]) -> tuple[int, int]:
    """(bytes of `largest(0)`, bytes each item of its list adds)."""
    empty = len(encode(largest(0)))
    return empty, len(encode(largest(1))) - empty


def _with_items(empty: int, item: int, n: int) -> int:
    """The bytes of a message of `empty` bytes with `n` items of `item` bytes in its list."""
    return empty + n * item + _list_header(n) - _list_header(0)


def _list_header(n: int) -> int:
    """Bytes of a msgpack array header of `n` entries (fixarray, array 16, array 32)."""
    return 1 if n < 16 else 3 if n < 1 << 16 else 5
