"""Wire schema v9, the bytes: `encode` and `decode` of common/wire/messages.py's messages.

Conventions and invariants:
- Arrays (`Group.ARRAYS`) are encoded as the raw little-endian bytes of their fixed dtype;
  decoding returns read-only `numpy.frombuffer` views (one bytes object per array, no other
  copy).
- `decode(data, limits)` never raises anything but `WireError(reason)`, whatever the bytes: it
  reads them with common/wire/reader.py, led by the schema, so only values the schema expects
  are ever built and a value of the wrong type is refused at its first byte. Limits: the message
  size (checked first; ZMQ_MAXMSGSIZE drops larger frames earlier), entries per list or map
  (`max_items`), values per message (`max_objects`), nesting (32), and memory: decoding builds
  at most `ALLOC_FACTOR` (4) bytes of Python objects per message byte plus `ALLOC_BASE_BYTES`
  (16 KiB), plus an allowance per item of the lists whose length the run sets and the
  receiver expects (`Limits.max_leases`, `max_lease_ids`, `max_acks`: `LEASE_BYTES`,
  `LEASE_ID_BYTES`, `ACK_BYTES` each), given only to the kinds that carry them (once the kind
  is read), else `over_budget` (`alloc_bound`). An empty list is 1
  byte on the wire and ~60 in Python: without a budget, a message of nested empty lists costs
  ~64x its size. The allowances exist because the protocol's own lists cost more than the
  factor: a held lease id of 1-9 bytes builds up to 52, a lease with a 6-character prompt
  ~7 bytes per byte; they are what one such item builds beyond the factor's share of its
  characters (`reader.fixed_cost`), so the largest grant, registration and goodbye
  the run's settings make decode (common/wire/sizes.py), and a hostile message of any shape
  builds at most the same bound. No ext types, no pickle. Unknown
  fields, wrong types (bool is not int), invalid UTF-8 and trailing bytes are refused. Error
  details never format untrusted values beyond short scalars (`Reader.show`).
- Map keys: the encoder writes `schema`, `kind`, then the fields in declaration order (so equal
  messages are equal bytes). The decoder accepts a map's entries in any order but refuses a key
  that appears twice (`duplicate_key`): with "last one wins", two readers of one message could
  disagree about what it says.
- A `Group` is checked against the run (`Limits`): G completions, lengths that agree
  (sum(completion_lens) == len(completion_ids); S sampled tokens == len(behavior_logp), S =
  sum L_i, or the set bits of `sampled_bits`, whose length, pad bits and first bit of every
  episode are checked before they are unpacked: one byte per token, within the memory bound),
  token ids in [0, vocab), log-probs finite and <= 0, rewards finite, the run's sampling
  temperature; and its kept sets, one per sampled token
  (`Limits.max_kept`: present exactly when the run truncates, one count per token summing to the
  kept ids, ids in [0, vocab), each set ascending without its sampled token, |K| <= max_kept:
  `common.sampling.kept_set.encoding_problem`, whose temporaries stay within the memory bound
  below). The fields of `Group.OMIT_EMPTY` are left out of the bytes when empty. Per-function
  rewards (`reward_parts`) are empty or F x G finite numbers, F = `Limits.num_reward_fns` when set.
- A peer of another schema version is refused by its first field (`schema_version`), with a
  detail that names both versions: run the same release on both sides.
- A status's heartbeat period (`Status.heartbeat_s`) must be positive and finite
  (`check_status`); a lease request's wait (`LeaseRequest.wait_s`) finite and in [0,
  `MAX_LEASE_WAIT_S`] (`check_lease_request`).
- A `LeaseGrant`'s leases are checked for their shape (`check_lease`): a prompt as text or as
  chat messages, not both; columns "" or a JSON object's text. The columns stay text here: a
  JSON value can cost tens of times its size in Python objects, so only the producer's reward
  workers parse it (producer/rewards/worker.py), where a failure is a counted reward error.
- A chunk reply is two ZeroMQ frames (`encode_chunk` / `decode_reply`): a `chunk_head` message
  (decoded like any other, bounded) and the chunk's bytes, raw, so neither side copies them into
  or out of a msgpack map; `num_bytes` must equal the second frame's length. Any other reply on
  the data path (a `reject`) is one frame.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from common.errors import WireError
from common.sampling.kept_set import encoding_problem
from common.wire import reader as mp
from common.wire.fetch import Chunk, ChunkHead
from common.wire.messages import (
    FINISH_REASONS,
    MAX_LEASE_WAIT_S,
    MAX_REWARD_ERROR_CHARS,
    SCHEMA_VERSION,
    Ack,
    Goodbye,
    Group,
    Heartbeat,
    Lease,
    LeaseGrant,
    LeaseRequest,
    Message,
    Register,
    Status,
    StatusReply,
    Welcome,
)


@dataclass(frozen=True, slots=True)
class Limits:
    """What a receiver accepts. `None` skips the run-specific checks (control replies).
    `max_leases`, `max_lease_ids` and `max_acks`: the longest lists of leases (a grant), lease
    ids (the held leases of a registration or goodbye) and acks (a status) the receiver
    expects, each item with its allowance in the decoding budget (`alloc_bound`;
    common/wire/sizes.py sets them for the control channel)."""

    max_message_bytes: int = 64 << 20
    max_items: int = 1 << 20  # entries of one msgpack list or map
    max_objects: int = 1 << 16  # msgpack values in one message (bounds the decoding work)
    vocab_size: int | None = None
    group_size: int | None = None
    temperature: float | None = None
    # an evaluation group's size and temperature (eval.samples_per_prompt, eval.temperature;
    # 0 = greedy); None: any
    eval_group_size: int | None = None
    eval_temperature: float | None = None
    max_prompt_tokens: int = 1 << 20
    max_completion_tokens: int = 1 << 20
    # kept sets: None = either way (no run to check against); 0 = the run does not truncate, so
    # a group carries none; k > 0 = it does, so a group carries them, each of at most k ids
    max_kept: int | None = None
    num_reward_fns: int | None = None  # F of `Group.reward_parts` (None: any F <= 64)
    max_leases: int = 0
    max_lease_ids: int = 0
    max_acks: int = 0


_KINDS: dict[str, type[Any]] = {cls.KIND: cls for cls in typing.get_args(Message)}
mp.prepare(*_KINDS.values(), names=("schema", "kind"))


# ---------------------------------------------------------------------------------------------
# Encoding


def encode(msg: Message) -> bytes:
    """The msgpack bytes of `msg` (deterministic: same message, same bytes)."""
    body: dict[str, Any] = {"schema": SCHEMA_VERSION, "kind": msg.KIND}
    body.update(_fields(msg))
    return msgpack.packb(body, use_bin_type=True, default=_fields)  # type: ignore[no-any-return]


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # a message class's field names, in order


def _fields(obj: Any) -> dict[str, Any]:
    """A message (or a message inside one) as msgpack takes it: its fields by name, in order,
    a group's arrays as raw bytes. msgpack's packer calls it for every dataclass it meets and
    walks the rest (lists, tuples, dicts, scalars) itself, in C; a class's field names are
    looked up once. Anything else is refused as msgpack refuses it (`TypeError`)."""
    cls = type(obj)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
            raise TypeError(f"cannot encode {cls.__name__}")
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(obj))
    if not isinstance(obj, Group):
        return {name: getattr(obj, name) for name in names}
    out = {}
    for name in names:
        value = getattr(obj, name)
        if name in Group.OMIT_EMPTY and len(value) == 0:
            continue
        if name in Group.ARRAYS:
            value = np.ascontiguousarray(value, dtype=Group.ARRAYS[name]).tobytes()
        out[name] = value
    return out


def encode_chunk(chunk: Chunk) -> list[bytes | memoryview]:
    """The two frames of a chunk reply: the `ChunkHead` message, then the bytes (not copied)."""
    head = ChunkHead(
        req=chunk.req,
        version=chunk.version,
        offset=chunk.offset,
        total_bytes=chunk.total_bytes,
        num_bytes=len(chunk.data),
    )
    return [encode(head), chunk.data]


# ---------------------------------------------------------------------------------------------
# Decoding


def decode_reply(frames: list[memoryview], limits: Limits = Limits()) -> Message | Chunk:
    """A reply on the data path: one frame is a message (`decode`); two frames are a chunk
    (`ChunkHead` + data, lengths cross-checked; `data` is `frames[1]`, not copied). Raises only
    `WireError`."""
    if len(frames) == 1:
        msg = decode(frames[0], limits)
        if isinstance(msg, ChunkHead):
            raise WireError("multipart", "a chunk head without its data frame")
        return msg
    if len(frames) != 2:
        raise WireError("multipart", f"{len(frames)} frames")
    head = decode(frames[0], limits)
    if not isinstance(head, ChunkHead):
        raise WireError("unexpected_kind", f"{type(head).__name__} before a data frame")
    if head.num_bytes != len(frames[1]):
        raise WireError(
            "length_mismatch", f"head says {head.num_bytes} bytes, frame has {len(frames[1])}"
        )
    return Chunk(
        req=head.req,
        version=head.version,
        offset=head.offset,
        total_bytes=head.total_bytes,
        data=frames[1],
    )


def decode(data: bytes | memoryview, limits: Limits = Limits()) -> Message:
    """Parse and check one message. Raises only `WireError`; builds at most
    `alloc_bound(len(data), limits)` bytes of objects (see the module doc)."""
    if len(data) > limits.max_message_bytes:
        raise WireError("too_large", f"{len(data)} bytes > {limits.max_message_bytes}")
    view = memoryview(data)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    view = view.toreadonly()  # hashable slices: field names are looked up by their bytes
    r = mp.Reader(
        view,
        budget=alloc_bound(len(view), limits, Heartbeat) - _UNCHARGED_BYTES,  # no allowance
        max_items=limits.max_items,
        max_objects=limits.max_objects,
    )
    tag, n, pos = r.head(0)
    if tag == mp.MAP:  # reading its entries walks (and checks) every value once
        entries, end = mp.read_entries(r, r.entries(tag, n, pos), pos, "message")
    else:
        end = r.skip(0)
    if end != len(view):
        raise mp.not_msgpack("trailing data after the message")
    if tag != mp.MAP:
        raise WireError("not_a_map", mp.TYPE_NAMES[tag])
    r.max_objects = 1 << 62  # counted once above; the typed reads below revisit few values
    missing: tuple[int, Any, int] = (mp.NIL, None, 0)
    at = entries.pop("schema", None)
    schema = r.head(at) if at is not None else missing
    if schema[0] != mp.INT or schema[1] != SCHEMA_VERSION:  # bool, float and str are not int
        raise WireError(
            "schema_version",
            f"got {r.show(*schema)}, this build speaks {SCHEMA_VERSION} (the peer runs another "
            "asyncgrpo release: run the same one on the consumer and every producer)",
        )
    at = entries.pop("kind", None)
    tag, length, start = r.head(at) if at is not None else missing
    cls = _KINDS.get(r.read_str(start, length)) if tag == mp.STR else None
    if cls is None:
        raise WireError("unknown_kind")
    r.budget += _allowance(cls, limits)  # for the lists this kind carries (`alloc_bound`)
    try:
        msg = mp.build(r, cls, entries, cls.__name__)
        if isinstance(msg, Group):
            check_group(msg, limits)
        elif isinstance(msg, LeaseGrant):
            for lease in msg.leases:
                check_lease(lease)
        if isinstance(msg, LeaseGrant | StatusReply | Welcome):
            check_status(msg.status)
        elif isinstance(msg, LeaseRequest):
            check_lease_request(msg)
    except WireError as exc:
        if cls is Group:
            exc.lease_id, exc.producer_id = _group_ids(r, entries)
        raise
    return msg  # type: ignore[no-any-return]


# The decoder's memory bound: what it builds is charged to a budget of ALLOC_FACTOR bytes per
# message byte plus a constant for the fixed costs of any message (its map of fields, the
# message object, the map of keys of the list item being built), plus an allowance per item of
# the lists the receiver expects (`Limits`): its two list slots (the list the items are read
# into, then the tuple) and what it builds beyond the factor's share of its characters. Peaks
# measured with tracemalloc: tests/unit/test_wire_fuzz.py.
ALLOC_FACTOR = 4
ALLOC_BASE_BYTES = 16 << 10
LEASE_BYTES = 2 * mp.SLOT_BYTES + mp.fixed_cost(Lease)  # 1124
LEASE_ID_BYTES = 2 * mp.SLOT_BYTES + mp.fixed_cost(int)  # 52
ACK_BYTES = 2 * mp.SLOT_BYTES + mp.fixed_cost(Ack)  # 212
_UNCHARGED_BYTES = 4 << 10  # kept back for what is not charged: an exception and its traceback,
# the keyword map of a message being built, error texts


def alloc_bound(num_bytes: int, limits: Limits, kind: type[Any] | None = None) -> int:
    """The most `decode` builds (bytes of objects) for a message of `num_bytes` under `limits`:
    of kind `kind` (its class), or of any kind (None)."""
    own = ALLOC_FACTOR * num_bytes + ALLOC_BASE_BYTES
    if kind is None:
        return own + max(_allowance(k, limits) for k in _KINDS.values())
    return own + _allowance(kind, limits)


def _allowance(kind: type[Any], limits: Limits) -> int:
    """The budget a message of `kind` gets for the lists the receiver expects in it: lease ids
    in a registration or goodbye, leases in a grant, acks in every status; none elsewhere (a
    heartbeat of many tiny counters stays `over_budget`)."""
    if kind in (Register, Goodbye, LeaseRequest):  # held, or (a lease request) declined
        return LEASE_ID_BYTES * limits.max_lease_ids
    acks = ACK_BYTES * limits.max_acks if kind in (LeaseGrant, StatusReply, Welcome) else 0
    return acks + (LEASE_BYTES * limits.max_leases if kind is LeaseGrant else 0)


def _group_ids(r: mp.Reader, entries: dict[str, int]) -> tuple[int | None, str | None]:
    """A refused group's lease id and producer id, when both parsed as such (whom to tell)."""
    lease, producer = entries.get("lease_id"), entries.get("producer_id")
    if lease is None or producer is None:
        return None, None
    try:
        return mp.read_of(int)(r, lease, "")[0], mp.read_of(str)(r, producer, "")[0]
    except WireError:
        return None, None


def check_lease(lease: Lease) -> None:
    """The shape of a granted lease (also run by `decode`): its prompt is text or chat
    messages, exactly one of them, each message with a role; its columns "" or a JSON object's
    text (read by the producer's reward workers, which parse it). Raises `WireError`."""
    if bool(lease.prompt) == bool(lease.messages):
        raise WireError("bad_value", "a lease holds a prompt text or chat messages, one of them")
    if any(not turn.role for turn in lease.messages):
        raise WireError("bad_value", "a chat message without a role")
    columns = lease.columns
    if columns and not (columns.startswith("{") and columns.endswith("}")):
        raise WireError("bad_value", "a lease's columns must be a JSON object")


def check_status(status: Status) -> None:
    """A status's heartbeat period is a positive, finite number of seconds (also run by
    `decode`: a producer sleeps on it). Raises `WireError`."""
    if not (math.isfinite(status.heartbeat_s) and status.heartbeat_s > 0):
        raise WireError("bad_value", "a status's heartbeat_s must be positive and finite")


def check_lease_request(msg: LeaseRequest) -> None:
    """A lease request's wait is a finite number of seconds in [0, `MAX_LEASE_WAIT_S`] (also
    run by `decode`: the consumer parks the request that long). Raises `WireError`."""
    if not (math.isfinite(msg.wait_s) and 0 <= msg.wait_s <= MAX_LEASE_WAIT_S):
        raise WireError(
            "bad_value", f"a lease request's wait_s must be in [0, {MAX_LEASE_WAIT_S:g}] s"
        )


def check_group(g: Group, limits: Limits) -> None:
    """The cross-field checks of a group (also run by `decode`). Raises `WireError`."""
    lens = g.completion_lens
    size = limits.eval_group_size if g.evaluation else limits.group_size
    if size is not None and len(lens) != size:
        what = "evaluates k" if g.evaluation else "samples G"
        raise WireError("group_size", f"{len(lens)} completions, the run {what}={size}")
    if len(lens) < 1 or len(g.rewards) != len(lens) or len(g.finish_reasons) != len(lens):
        raise WireError("length_mismatch", "completion_lens, rewards and finish_reasons differ")
    if (lens < 1).any() or (lens > limits.max_completion_tokens).any():
        raise WireError("bad_length", "a completion is empty or longer than max_new_tokens")
    total = int(lens.astype(np.int64).sum())
    if total != len(g.completion_ids):
        raise WireError("length_mismatch", "sum(completion_lens) != len(completion_ids)")
    sampled = _check_sampled(g, total)
    if sampled != len(g.behavior_logp):
        raise WireError("length_mismatch", "len(logprobs) != the number of sampled tokens")
    if len(g.token_versions) not in (0, sampled):
        raise WireError("length_mismatch", "token_versions must be empty or one per sampled token")
    if not 0 < len(g.prompt_ids) <= limits.max_prompt_tokens:
        raise WireError("bad_length", f"prompt has {len(g.prompt_ids)} tokens")
    vocab = limits.vocab_size  # None: any non-negative int32 (the largest one included)
    for ids in (g.prompt_ids, g.completion_ids):  # neither is empty (checked above)
        if int(ids.min()) < 0:
            raise WireError("token_out_of_range", f"negative token id {int(ids.min())}")
        if vocab is not None and int(ids.max()) >= vocab:
            raise WireError("token_out_of_range", f"token id {int(ids.max())} >= vocab {vocab}")
    logp = g.behavior_logp
    if not np.isfinite(logp).all() or (logp > 0).any():
        raise WireError("bad_logprob", "behaviour log-probs must be finite and <= 0")
    if not np.isfinite(g.rewards).all():
        raise WireError("bad_reward", "rewards must be finite")
    _check_reward_parts(g, limits)
    if any(r not in FINISH_REASONS for r in g.finish_reasons):
        raise WireError("bad_value", f"finish_reasons must be in {FINISH_REASONS}")
    if g.behavior_version < 0 or g.lease_id < 0 or g.num_reward_errors < 0:
        raise WireError("bad_value", "negative version, lease id or counter")
    if len(g.reward_error) > MAX_REWARD_ERROR_CHARS:
        raise WireError("bad_length", f"reward_error longer than {MAX_REWARD_ERROR_CHARS}")
    if not (math.isfinite(g.env_s) and g.env_s >= 0 and math.isfinite(g.gen_s)):
        raise WireError("bad_value", "gen_s and env_s must be finite, env_s >= 0")
    if len(g.token_versions) and int(g.token_versions.min()) != g.behavior_version:
        raise WireError("bad_value", "behavior_version must equal min(token_versions)")
    _check_temperature(g, limits)
    if g.evaluation:  # one version, no kept sets: never trained
        if len(g.token_versions) or len(g.kept_counts) or len(g.kept_ids) or len(g.kept_unknown):
            raise WireError("bad_value", "an evaluation group carries one version, no kept sets")
        return
    _check_kept(g, limits)


def _check_sampled(g: Group, total: int) -> int:
    """The number of sampled tokens S; with `sampled_bits`: ceil(total / 8) bytes, pad bits 0,
    every completion starting with a sampled token. Checked before the bits are unpacked (one
    byte per token, a quarter of the ids' own bytes: within the decoder's memory bound)."""
    bits = g.sampled_bits
    if not len(bits):
        return total
    if len(bits) != (total + 7) // 8:
        raise WireError("length_mismatch", "sampled_bits must hold one bit per completion token")
    if total % 8 and int(bits[-1]) >> (total % 8):
        raise WireError("bad_value", "sampled_bits: pad bits past the last token must be 0")
    mask = g.sampled_mask()
    starts = np.cumsum(g.completion_lens, dtype=np.int64) - g.completion_lens
    if not mask[starts].all():
        raise WireError("bad_value", "an episode must start with a sampled token")
    return int(np.count_nonzero(mask))


def _check_temperature(g: Group, limits: Limits) -> None:
    """Finite, > 0 (0 = greedy: evaluation groups only), the run's (or its evaluation's)."""
    floor_ok = g.temperature > 0 or (g.evaluation and g.temperature == 0)
    if not (math.isfinite(g.temperature) and floor_ok):
        raise WireError("bad_value", "temperature must be finite and > 0")
    expected = limits.eval_temperature if g.evaluation else limits.temperature
    if expected is not None and not math.isclose(g.temperature, expected, rel_tol=1e-6):
        raise WireError("sampling_mismatch", f"temperature {g.temperature} != {expected}")


def _check_reward_parts(g: Group, limits: Limits) -> None:
    n, size = len(g.reward_parts), len(g.completion_lens)
    fns = limits.num_reward_fns
    if n and (n % size or n // size > (fns if fns is not None else 64)):
        raise WireError(
            "length_mismatch", f"reward_parts holds {n} scores, not F x G (G = {size}, F = {fns})"
        )
    if not np.isfinite(g.reward_parts).all():
        raise WireError("bad_reward", "reward_parts must be finite")


def _check_kept(g: Group, limits: Limits) -> None:
    kept = g.kept
    if limits.max_kept == 0 and (kept.present or len(kept.ids) or len(kept.unknown)):
        raise WireError("sampling_mismatch", "kept sets in a run without truncated sampling")
    if limits.max_kept and not kept.present:
        raise WireError("sampling_mismatch", "the run samples truncated: kept sets are missing")
    ids = g.completion_ids[g.sampled_mask()] if g.episodes else g.completion_ids
    problem = encoding_problem(
        kept, ids, vocab_size=limits.vocab_size, max_kept=limits.max_kept or None
    )
    if problem is not None:
        raise WireError("bad_kept_set", problem)
