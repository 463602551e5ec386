"""Wire schema v2: the only package that knows the bytes.

- messages.py: every message kind as a frozen dataclass (the table of kinds, sockets and fields),
  `SCHEMA_VERSION`, the finish reasons, the lease outcomes and the backpressure acks;
- codec.py: `encode(msg) -> bytes` (deterministic) and `decode(data, limits) -> Message`, which
  raises only `WireError(reason)` whatever the bytes and builds a bounded amount of objects;
  `encode_chunk` / `decode_reply` for the two-frame chunk replies of the data path;
- sizes.py: the lists whose length a run sets (leases, lease ids, acks), the limits the control
  channel's two ends decode them with, and the settings whose largest messages would not fit.

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

__all__ = [
    "ACKS_PER_REPLY",
    "ACK_BYTES",
    "ALLOC_BASE_BYTES",
    "ALLOC_FACTOR",
    "FINISH_REASONS",
    "HOLD",
    "LEASE_BYTES",
    "LEASE_ID_BYTES",
    "MAX_CONTROL_BYTES",
    "MAX_LEASES_PER_GRANT",
    "MAX_LEASE_IDS",
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
    "alloc_bound",
    "check_group",
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
