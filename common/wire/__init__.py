"""Wire schema v3: the only package that knows the bytes.

- messages.py: every message kind as a frozen dataclass (the table of kinds, sockets and fields),
  `SCHEMA_VERSION`, the finish reasons, the lease outcomes and the backpressure acks;
- codec.py: `encode(msg) -> bytes` (deterministic) and `decode(data, limits) -> Message`, which
  raises only `WireError(reason)` whatever the bytes and builds a bounded amount of objects;
  `encode_chunk` / `decode_reply` for the two-frame chunk replies of the data path.

Everyone else imports from here (`from common import wire`; `wire.encode`, `wire.Group`) and
never builds message dicts by hand.
"""

from __future__ import annotations

from common.errors import WireError
from common.wire.codec import (
    ALLOC_BASE_BYTES,
    ALLOC_FACTOR,
    Limits,
    check_group,
    decode,
    decode_reply,
    encode,
    encode_chunk,
)
from common.wire.messages import (
    FINISH_REASONS,
    HOLD,
    OUTCOMES,
    SCHEMA_VERSION,
    SEND,
    Ack,
    Announce,
    BadSource,
    Chunk,
    ChunkHead,
    FetchDone,
    FetchPlan,
    FetchRequest,
    FileChunkRequest,
    Goodbye,
    Group,
    Heartbeat,
    Lease,
    LeaseGrant,
    LeaseRequest,
    Message,
    Register,
    Reject,
    RewardWeight,
    RunSpec,
    SnapshotInfo,
    Source,
    Status,
    StatusReply,
    Welcome,
)

__all__ = [
    "ALLOC_BASE_BYTES",
    "ALLOC_FACTOR",
    "FINISH_REASONS",
    "HOLD",
    "OUTCOMES",
    "SCHEMA_VERSION",
    "SEND",
    "Ack",
    "Announce",
    "BadSource",
    "Chunk",
    "ChunkHead",
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
    "check_group",
    "decode",
    "decode_reply",
    "encode",
    "encode_chunk",
]
