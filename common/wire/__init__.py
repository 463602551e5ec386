"""Wire schema v9: the only package that knows the bytes.

- messages.py: every message kind as a frozen dataclass (the table of kinds, sockets and fields),
  `SCHEMA_VERSION`, the finish reasons, the lease outcomes and the backpressure acks;
- fetch.py: the data path's messages (a producer fetching a snapshot's or the model's files,
  chunk by chunk, from the consumer or a relay);
- spec.py: the run spec a producer takes from the consumer in its welcome (`RunSpec`, its
  `RewardWeight`s and the model directory's `ModelFile`s);
- codec.py: `encode(msg) -> bytes` (deterministic) and `decode(data, limits) -> Message`, which
  raises only `WireError(reason)` whatever the bytes and builds a bounded amount of objects;
  `encode_chunk` / `decode_reply` for the two-frame chunk replies of the data path;
- sizes.py: the lists whose length a run sets (leases, lease ids, acks), the limits the control
  channel's two ends decode them with, and the settings whose largest messages would not fit.
- reader.py: untrusted msgpack into typed dataclasses, led by the schema, within a memory budget
  (what `decode` reads with).

Everyone else imports from here (`from common import wire`; `wire.encode`, `wire.Group`) and
never builds message dicts by hand.
"""

from __future__ import annotations

from common.errors import WireError
from common.wire.codec import (
    ACK_BYTES,
    ALLOC_BASE_BYTES,
    ALLOC_FACTOR,
    LEASE_BYTES,
    LEASE_ID_BYTES,
    Limits,
    alloc_bound,
    check_group,
    check_lease,
    check_status,
    decode,
    decode_reply,
    encode,
    encode_chunk,
)
from common.wire.fetch import (
    BAD_SOURCE_REASONS,
    BadSource,
    Chunk,
    ChunkHead,
    FetchDone,
    FetchPlan,
    FetchRequest,
    FileChunkRequest,
    Source,
)
from common.wire.messages import (
    EVALUATED,
    FINISH_REASONS,
    HOLD,
    MAX_LEASE_WAIT_S,
    MAX_REWARD_ERROR_CHARS,
    OUTCOMES,
    SCHEMA_VERSION,
    SEND,
    Ack,
    Announce,
    ChatTurn,
    Goodbye,
    Group,
    Heartbeat,
    Lease,
    LeaseGrant,
    LeaseRequest,
    Message,
    Register,
    Reject,
    SnapshotInfo,
    Status,
    StatusReply,
    Welcome,
)
from common.wire.sizes import (
    ACKS_PER_REPLY,
    MAX_CONTROL_BYTES,
    MAX_LEASE_IDS,
    MAX_LEASES_PER_GRANT,
    control_limits,
    largest_grant,
    largest_message_bytes,
    largest_register,
    reply_limits,
)
from common.wire.spec import EpisodeSpec, ModelFile, RewardWeight, RunSpec

__all__ = [
    "ACKS_PER_REPLY",
    "ACK_BYTES",
    "ALLOC_BASE_BYTES",
    "ALLOC_FACTOR",
    "BAD_SOURCE_REASONS",
    "EVALUATED",
    "FINISH_REASONS",
    "HOLD",
    "LEASE_BYTES",
    "LEASE_ID_BYTES",
    "MAX_CONTROL_BYTES",
    "MAX_LEASES_PER_GRANT",
    "MAX_LEASE_IDS",
    "MAX_LEASE_WAIT_S",
    "MAX_REWARD_ERROR_CHARS",
    "OUTCOMES",
    "SCHEMA_VERSION",
    "SEND",
    "Ack",
    "Announce",
    "BadSource",
    "ChatTurn",
    "Chunk",
    "ChunkHead",
    "EpisodeSpec",
    "FetchDone",
    "FetchPlan",
    "FetchRequest",
    "FileChunkRequest",
    "Goodbye",
    "Group",
    "Heartbeat",
    "Lease",
    "LeaseGrant",
    "LeaseRequest",
    "Limits",
    "Message",
    "ModelFile",
    "Register",
    "Reject",
    "RewardWeight",
    "RunSpec",
    "SnapshotInfo",
    "Source",
    "Status",
    "StatusReply",
    "Welcome",
    "WireError",
    "alloc_bound",
    "check_group",
    "check_lease",
    "check_status",
    "control_limits",
    "decode",
    "decode_reply",
    "encode",
    "encode_chunk",
    "largest_grant",
    "largest_message_bytes",
    "largest_register",
    "reply_limits",
]
