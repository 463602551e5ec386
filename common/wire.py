"""Wire schema v2: the only module that knows the bytes.

Every message is one msgpack map whose first key is `schema` (= SCHEMA_VERSION) and second `kind`.
Everyone else sees the frozen dataclasses below; nobody builds message dicts by hand.

| kind        | socket / direction               | fields (besides schema, kind)                  |
|-------------|----------------------------------|------------------------------------------------|
| register    | control, producer → consumer     | req, producer_id, host, pid, engine,           |
|             |                                  | loaded_version, held_leases                    |
| heartbeat   | control, producer → consumer     | req, producer_id, loaded_version, state,       |
|             |                                  | num_in_flight, counters                        |
| lease_req   | control, producer → consumer     | req, producer_id, max_leases, loaded_version   |
| goodbye     | control, producer → consumer     | req, producer_id, held_leases                  |
| fetch_req   | control, producer → consumer     | req, producer_id, version, held_version,       |
|             |                                  | held_hash, relay (Source)                      |
| fetch_done  | control, producer → consumer     | req, producer_id, version, file, ok, num_bytes,|
|             |                                  | bad_sources (BadSource…), serving              |
| file_chunk_req | data or a relay, fetcher →    | req, version, file, offset, max_bytes          |
| welcome     | control, reply to register       | req, spec (RunSpec), status (Status)           |
| status      | control, reply to heartbeat etc. | req, status                                    |
| lease_grant | control, reply to lease_req      | req, leases (Lease…), status                   |
| chunk_head  | reply to file_chunk_req          | req, version, offset, total_bytes, num_bytes   |
|             | (frame 1 of 2; frame 2: the bytes)|                                               |
| fetch_plan  | control, reply to fetch_req      | req, version, file, base_version, num_bytes,   |
|             |                                  | hash, result_hash, chunk_bytes, chunk_hashes,  |
|             |                                  | sources (Source…), wait_s                      |
| reject      | control, reply to a bad request  | req, reason, detail                            |
| group       | rollouts, PUSH → PULL            | see `Group`                                    |
| announce    | announce, PUB → SUB              | run_id, policy_version, snapshot               |

Conventions and invariants:
- Arrays travel as raw little-endian bytes whose dtype the schema fixes (`_ARRAY_DTYPES`: token ids
  int32, log-probs and rewards float32), never as lists of numbers: ~8 bytes per sampled token.
  Decoding returns read-only `numpy.frombuffer` views (one bytes object per array, no other copy).
- `decode(data, limits)` never raises anything but `WireError(reason)`, whatever the bytes: it
  reads them with common/msgpack_reader.py, led by the schema, so only values the schema expects
  are ever built and a value of the wrong type is refused at its first byte. Limits: the message
  size (checked first; ZMQ_MAXMSGSIZE drops larger frames earlier), entries per list or map
  (`max_items`), values per message (`max_objects`), nesting (32), and memory: decoding builds
  at most `ALLOC_FACTOR` (4) bytes of Python objects per message byte plus `ALLOC_BASE_BYTES`
  (16 KiB), else `over_budget` (an empty list is 1 byte on the wire and ~60 in Python: without
  this, a message of nested empty lists costs ~64x its size). No ext types, no pickle. Unknown
  fields, wrong types (bool is not int), invalid UTF-8 and trailing bytes are refused. Error
  details never format untrusted values beyond short scalars (`Reader.show`).
- Map keys: the encoder writes `schema`, `kind`, then the fields in declaration order (so equal
  messages are equal bytes). The decoder accepts a map's entries in any order but refuses a key
  that appears twice (`duplicate_key`): with "last one wins", two readers of one message could
  disagree about what it says.
- A `Group` is checked against the run (`Limits`): G completions, lengths that agree
  (sum(completion_lens) == len(completion_ids) == len(behavior_logp)), token ids in [0, vocab),
  log-probs finite and <= 0, rewards finite, the run's sampling temperature.
- Fetching a snapshot over the network (producer/fetch.py, consumer/fanout.py): `fetch_req`
  asks the consumer how; `fetch_plan` names the file (`weights`, or `delta` on `base_version`),
  its per-chunk BLAKE3 digests (`chunk_hashes`: 32 raw bytes per chunk) and where to fetch
  (`sources`, in order; a `Source` with endpoint "" is the consumer's data socket, at
  `RunSpec.data_port`); chunks come as `file_chunk_req` → a two-frame reply from any source,
  and each is accepted only if it hashes to its digest; `fetch_done` reports the outcome, the
  sources that misbehaved, and whether the producer now serves the file as a relay.
- A chunk reply is two ZeroMQ frames (`encode_chunk` / `decode_reply`): a `chunk_head` message
  (decoded like any other, bounded) and the chunk's bytes, raw, so neither side copies them into
  or out of a msgpack map; `num_bytes` must equal the second frame's length. Any other reply on
  the data path (a `reject`) is one frame.
- Acks: a group is acknowledged with its lease's final outcome (`OUTCOMES`); a consumer
  without room for it says `hold` (the producer keeps it and does not re-send it on its own
  timer) and later `send` (re-send it now).
- `behavior_version` is the oldest weight version that produced any token of the group;
  `token_versions` is empty unless the weights changed mid-generation (then one int32 per token).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

import msgpack
import numpy as np

from common import msgpack_reader as mp
from common.errors import WireError

SCHEMA_VERSION = 2  # 2: snapshot chunks moved to the data socket (`chunk_head` + bytes)
FINISH_REASONS = ("stop", "length", "abort")
OUTCOMES = (
    "trained",
    "dropped_stale",
    "dropped_zero_variance",
    "rejected_invalid",
    "expired",
)
# Acks that are not outcomes (the lease stays open): the consumer had no room for the group, so
# its producer keeps it (`hold`), until told to send it again (`send`): consumer/admission.py.
HOLD, SEND = "hold", "send"
_ARRAY_DTYPES: dict[str, np.dtype[Any]] = {  # fields of `Group` only
    "prompt_ids": np.dtype("<i4"),
    "completion_ids": np.dtype("<i4"),
    "completion_lens": np.dtype("<i4"),
    "token_versions": np.dtype("<i4"),
    "behavior_logp": np.dtype("<f4"),
    "rewards": np.dtype("<f4"),
}


@dataclass(frozen=True, slots=True)
class Limits:
    """What a receiver accepts. `None` skips the run-specific checks (control replies)."""

    max_message_bytes: int = 64 << 20
    max_items: int = 1 << 20  # entries of one msgpack list or map
    max_objects: int = 1 << 16  # msgpack values in one message (bounds the decoding work)
    vocab_size: int | None = None
    group_size: int | None = None
    temperature: float | None = None
    max_prompt_tokens: int = 1 << 20
    max_completion_tokens: int = 1 << 20


# ---------------------------------------------------------------------------------------------
# Messages. `KIND` is the wire tag; field order is the wire order.


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    version: int
    num_bytes: int
    hash: str  # blake3 hex digest of the safetensors file
    path: str  # consumer-local path; used by producers that share the filesystem


@dataclass(frozen=True, slots=True)
class Ack:
    lease_id: int
    outcome: str  # one of OUTCOMES (final), or HOLD / SEND (backpressure; the lease stays open)


@dataclass(frozen=True, slots=True)
class Status:
    run_id: str  # changes when the consumer restarts: producers re-send what is unacked
    policy_version: int
    snapshot: SnapshotInfo | None
    acks: tuple[Ack, ...] = ()
    finished: bool = False  # the learner needs no more groups: producers may exit


@dataclass(frozen=True, slots=True)
class RewardWeight:
    fn: str  # built-in name or "module:function", resolved on the producer
    weight: float


@dataclass(frozen=True, slots=True)
class RunSpec:
    """The run settings a producer takes from the consumer (one source of truth)."""

    group_size: int
    vocab_size: int
    max_staleness: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    prompt_format: str  # "raw" | "chat"
    model: str
    rollouts_port: int
    announce_port: int
    heartbeat_s: float
    max_message_bytes: int
    reward_fns: tuple[RewardWeight, ...]
    reward_timeout_s: float
    data_port: int  # the consumer's data socket (snapshot chunks: consumer/dataplane.py)


@dataclass(frozen=True, slots=True)
class Lease:
    lease_id: int
    prompt_index: int
    step: int  # the optimizer step this prompt is meant for
    min_version: int  # start generating only with weights of at least this version
    prompt: str
    answer: str


@dataclass(frozen=True, slots=True)
class Register:
    KIND: ClassVar[str] = "register"
    req: int
    producer_id: str
    host: str
    pid: int
    engine: str
    loaded_version: int
    held_leases: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Heartbeat:
    KIND: ClassVar[str] = "heartbeat"
    req: int
    producer_id: str
    loaded_version: int
    state: str
    num_in_flight: int
    counters: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    KIND: ClassVar[str] = "lease_req"
    req: int
    producer_id: str
    max_leases: int
    loaded_version: int


@dataclass(frozen=True, slots=True)
class Source:
    """Where a fetcher may take chunks: "" = the consumer's data socket, else a relay's
    endpoint (`tcp://host:port`) and its CurveZMQ public key (z85; "" without keys)."""

    endpoint: str
    server_key: str


@dataclass(frozen=True, slots=True)
class BadSource:
    endpoint: str
    reason: str  # wrong_bytes | truncated | stalled | refused


@dataclass(frozen=True, slots=True)
class FetchRequest:
    KIND: ClassVar[str] = "fetch_req"
    req: int
    producer_id: str
    version: int
    held_version: int  # the snapshot whose verified file this producer holds (-1: none)
    held_hash: str
    relay: Source | None  # where this producer serves what it holds (None: it does not)


@dataclass(frozen=True, slots=True)
class FetchDone:
    KIND: ClassVar[str] = "fetch_done"
    req: int
    producer_id: str
    version: int
    file: str  # "weights" | "delta"
    ok: bool
    num_bytes: int
    bad_sources: tuple[BadSource, ...]
    serving: bool  # the producer now serves this version from its relay


@dataclass(frozen=True, slots=True)
class FileChunkRequest:
    KIND: ClassVar[str] = "file_chunk_req"
    req: int
    version: int
    file: str  # "weights" | "delta"
    offset: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchPlan:
    KIND: ClassVar[str] = "fetch_plan"
    req: int
    version: int
    file: str  # "weights" | "delta"
    base_version: int  # the version a delta applies to (-1 for weights)
    num_bytes: int
    hash: str  # blake3 hex of the file
    result_hash: str  # blake3 hex of the snapshot's weights (== hash for weights)
    chunk_bytes: int
    chunk_hashes: bytes  # 32 raw bytes (BLAKE3) per chunk
    sources: tuple[Source, ...]
    wait_s: float  # > 0: every source is busy; ask again after this long


@dataclass(frozen=True, slots=True)
class Goodbye:
    KIND: ClassVar[str] = "goodbye"
    req: int
    producer_id: str
    held_leases: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Welcome:
    KIND: ClassVar[str] = "welcome"
    req: int
    spec: RunSpec
    status: Status


@dataclass(frozen=True, slots=True)
class StatusReply:
    KIND: ClassVar[str] = "status"
    req: int
    status: Status


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    KIND: ClassVar[str] = "lease_grant"
    req: int
    leases: tuple[Lease, ...]
    status: Status


@dataclass(frozen=True, slots=True)
class ChunkHead:
    """The first frame of a chunk reply; the second frame holds exactly `num_bytes` bytes."""

    KIND: ClassVar[str] = "chunk_head"
    req: int
    version: int
    offset: int
    total_bytes: int  # size of the whole file
    num_bytes: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk reply as its reader sees it (not a message kind: `ChunkHead` + the data frame).
    `data` is whatever buffer the transport gave (a zero-copy view of a received frame)."""

    req: int
    version: int
    offset: int
    total_bytes: int
    data: bytes | memoryview


@dataclass(frozen=True, slots=True)
class Reject:
    KIND: ClassVar[str] = "reject"
    req: int
    reason: str
    detail: str


@dataclass(frozen=True, slots=True, eq=False)
class Group:
    """G completions of one leased prompt, scored. Arrays are flat; see `completion(i)`."""

    KIND: ClassVar[str] = "group"
    ARRAYS: ClassVar[dict[str, np.dtype[Any]]] = _ARRAY_DTYPES  # raw array fields, their dtypes
    lease_id: int
    producer_id: str
    prompt_index: int
    behavior_version: int
    prompt_ids: np.ndarray  # int32 [P]
    completion_ids: np.ndarray  # int32 [sum L_i]
    completion_lens: np.ndarray  # int32 [G]
    behavior_logp: np.ndarray  # float32 [sum L_i], log-probs of the sampled tokens (<= 0)
    token_versions: np.ndarray  # int32 [sum L_i], or [0] when every token has behavior_version
    rewards: np.ndarray  # float32 [G]
    finish_reasons: tuple[str, ...]  # G entries of FINISH_REASONS
    temperature: float
    num_reward_errors: int = 0
    gen_s: float = 0.0  # wall seconds from lease start to the last completion

    @property
    def group_size(self) -> int:
        return len(self.completion_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.completion_ids)

    def completion(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and behaviour log-probs of completion `i` (views)."""
        start = int(self.completion_lens[:i].sum())
        stop = start + int(self.completion_lens[i])
        return self.completion_ids[start:stop], self.behavior_logp[start:stop]


@dataclass(frozen=True, slots=True)
class Announce:
    KIND: ClassVar[str] = "announce"
    run_id: str
    policy_version: int
    snapshot: SnapshotInfo


Message = Union[  # noqa: UP007 (a runtime alias, used by isinstance-free dispatch)
    Register,
    Heartbeat,
    LeaseRequest,
    Goodbye,
    FetchRequest,
    FetchDone,
    FileChunkRequest,
    FetchPlan,
    Welcome,
    StatusReply,
    LeaseGrant,
    ChunkHead,
    Reject,
    Group,
    Announce,
]
_KINDS: dict[str, type[Any]] = {cls.KIND: cls for cls in typing.get_args(Message)}
mp.prepare(*_KINDS.values(), names=("schema", "kind"))


# ---------------------------------------------------------------------------------------------
# Encoding


def encode(msg: Message) -> bytes:
    """The msgpack bytes of `msg` (deterministic: same message, same bytes)."""
    body: dict[str, Any] = {"schema": SCHEMA_VERSION, "kind": msg.KIND}
    body.update(_to_wire(msg))
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


def _to_wire(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(obj, Group) and f.name in _ARRAY_DTYPES:
                out[f.name] = np.ascontiguousarray(value, dtype=_ARRAY_DTYPES[f.name]).tobytes()
            else:
                out[f.name] = _to_wire(value)
        return out
    if isinstance(obj, tuple | list):
        return [_to_wire(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _to_wire(v) for k, v in obj.items()}
    return obj


def encode_chunk(chunk: Chunk) -> list[bytes | memoryview]:
    """The two frames of a chunk reply: the `ChunkHead` message, then the bytes (not copied)."""
    head = ChunkHead(chunk.req, chunk.version, chunk.offset, chunk.total_bytes, len(chunk.data))
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
    return Chunk(head.req, head.version, head.offset, head.total_bytes, frames[1])


def decode(data: bytes | memoryview, limits: Limits = Limits()) -> Message:
    """Parse and check one message. Raises only `WireError`; builds at most
    `ALLOC_FACTOR * len(data) + ALLOC_BASE_BYTES` bytes of objects (see the module doc)."""
    if len(data) > limits.max_message_bytes:
        raise WireError("too_large", f"{len(data)} bytes > {limits.max_message_bytes}")
    view = memoryview(data)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    view = view.toreadonly()  # hashable slices: field names are looked up by their bytes
    r = mp.Reader(
        view,
        budget=ALLOC_FACTOR * len(view) + ALLOC_BASE_BYTES - _UNCHARGED_BYTES,
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
            "schema_version", f"got {r.show(*schema)}, this build speaks {SCHEMA_VERSION}"
        )
    at = entries.pop("kind", None)
    tag, length, start = r.head(at) if at is not None else missing
    cls = _KINDS.get(r.read_str(start, length)) if tag == mp.STR else None
    if cls is None:
        raise WireError("unknown_kind")
    try:
        msg = mp.build(r, cls, entries, cls.__name__)
        if isinstance(msg, Group):
            check_group(msg, limits)
    except WireError as exc:
        if cls is Group:
            exc.lease_id, exc.producer_id = _group_ids(r, entries)
        raise
    return msg  # type: ignore[no-any-return]


# The decoder's memory bound: what it builds is charged to a budget of ALLOC_FACTOR bytes per
# message byte plus a constant for the fixed costs of any message (its map of fields, the
# message object). Peaks measured with tracemalloc: tests/unit/test_wire_fuzz.py.
ALLOC_FACTOR = 4
ALLOC_BASE_BYTES = 16 << 10
_UNCHARGED_BYTES = 4 << 10  # kept back for what is not charged: an exception and its traceback,
# the keyword map of a message being built, error texts


def _group_ids(r: mp.Reader, entries: dict[str, int]) -> tuple[int | None, str | None]:
    """A refused group's lease id and producer id, when both parsed as such (whom to tell)."""
    lease, producer = entries.get("lease_id"), entries.get("producer_id")
    if lease is None or producer is None:
        return None, None
    try:
        return mp.read_of(int)(r, lease, "")[0], mp.read_of(str)(r, producer, "")[0]
    except WireError:
        return None, None


def check_group(g: Group, limits: Limits) -> None:
    """The cross-field checks of a group (also run by `decode`). Raises `WireError`."""
    lens = g.completion_lens
    if limits.group_size is not None and len(lens) != limits.group_size:
        raise WireError(
            "group_size", f"{len(lens)} completions, the run samples G={limits.group_size}"
        )
    if len(lens) < 1 or len(g.rewards) != len(lens) or len(g.finish_reasons) != len(lens):
        raise WireError("length_mismatch", "completion_lens, rewards and finish_reasons differ")
    if (lens < 1).any() or (lens > limits.max_completion_tokens).any():
        raise WireError("bad_length", "a completion is empty or longer than max_new_tokens")
    total = int(lens.astype(np.int64).sum())
    if total != len(g.completion_ids) or total != len(g.behavior_logp):
        raise WireError("length_mismatch", "sum(completion_lens) != len(ids) or len(logprobs)")
    if len(g.token_versions) not in (0, total):
        raise WireError("length_mismatch", "token_versions must be empty or one per token")
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
    if any(r not in FINISH_REASONS for r in g.finish_reasons):
        raise WireError("bad_value", f"finish_reasons must be in {FINISH_REASONS}")
    if g.behavior_version < 0 or g.lease_id < 0 or g.num_reward_errors < 0:
        raise WireError("bad_value", "negative version, lease id or counter")
    if len(g.token_versions) and int(g.token_versions.min()) != g.behavior_version:
        raise WireError("bad_value", "behavior_version must equal min(token_versions)")
    if not (math.isfinite(g.temperature) and g.temperature > 0):
        raise WireError("bad_value", "temperature must be finite and > 0")
    if limits.temperature is not None and not math.isclose(
        g.temperature, limits.temperature, rel_tol=1e-6
    ):
        raise WireError("sampling_mismatch", f"temperature {g.temperature} != {limits.temperature}")
