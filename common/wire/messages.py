"""Wire schema v9, the messages: every kind, its fields in wire order, the constants they use.

Every message is one msgpack map whose first key is `schema` (= SCHEMA_VERSION) and second `kind`;
common/wire/codec.py alone writes and reads the bytes. Everyone else sees the frozen dataclasses
below; nobody builds message dicts by hand.

| kind        | socket / direction               | fields (besides schema, kind)                  |
|-------------|----------------------------------|------------------------------------------------|
| register    | control, producer → consumer     | req, producer_id, host, pid, engine,           |
|             |                                  | loaded_version, held_leases                    |
| heartbeat   | control, producer → consumer     | req, producer_id, loaded_version, state,       |
|             |                                  | num_in_flight, counters                        |
| lease_req   | control, producer → consumer     | req, producer_id, max_leases, loaded_version,  |
|             |                                  | declined, max_eval_leases, wait_s              |
| goodbye     | control, producer → consumer     | req, producer_id, held_leases                  |
| fetch_req   | control, producer → consumer     | req, producer_id, version, held_version,       |
|             |                                  | held_hash, relay (Source)                      |
| fetch_done  | control, producer → consumer     | req, producer_id, version, file, ok, num_bytes,|
|             |                                  | bad_sources (BadSource…), serving              |
| file_chunk_req | data or a relay, fetcher →    | req, version, file, offset, max_bytes          |
| welcome     | control, reply to register       | req, spec (RunSpec), status (Status)           |
| status      | control, reply to heartbeat etc. | req, status                                    |
| lease_grant | control, reply to lease_req      | req, leases (Lease…), status; a Lease: lease_id,|
|             |                                  | prompt_index, step, min_version, prompt,       |
|             |                                  | answer, messages (ChatTurn…), columns (JSON),  |
|             |                                  | eval_version                                   |
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
  (Decoding returns read-only `numpy.frombuffer` views: common/wire/codec.py.)
- Fetching a snapshot over the network (producer/fetch/fetcher.py, consumer/snapshots/fanout.py):
`fetch_req`
  asks the consumer how; `fetch_plan` names the file (`weights`, or `delta` on `base_version`),
  its per-chunk BLAKE3 digests (`chunk_hashes`: 32 raw bytes per chunk) and where to fetch
  (`sources`, in order; a `Source` with endpoint "" is the consumer's data socket, at
  `RunSpec.data_port`); chunks come as `file_chunk_req` → a two-frame reply from any source,
  and each is accepted only if it hashes to its digest; `fetch_done` reports the outcome, the
  sources that misbehaved, and whether the producer now serves the file as a relay.
- Acks: a group is acknowledged with its lease's final outcome (`OUTCOMES`); a consumer
  without room for it says `hold` (the producer keeps it and does not re-send it on its own
  timer) and later `send` (re-send it now).
- A lease carries its prompt either as text (`prompt`) or as chat messages (`messages`), never
  both, and the rest of its row as one JSON object (`columns`, at most `task.max_row_kib` with
  the prompt and answer: the consumer refuses larger rows when it loads them), which the
  producer hands to reward functions; the decoder checks the shape (`check_lease`).
- `behavior_version` is the oldest weight version that produced any sampled token of the group;
  `token_versions` is empty unless the weights changed mid-generation (then one int32 per
  sampled token).
- Episodes (multi-turn: `RunSpec.episodes`, producer/episodes/): a completion is a whole episode
  after the prompt, the model's turns and the environment's messages in between. Which of its
  tokens the model sampled travels as one bit per token (`sampled_bits`, uint8, numpy's
  `packbits` in little bit order over `completion_ids`, 1 = sampled, 0 = inserted by the
  environment; ceil(sum L_i / 8) bytes, the pad bits 0): an inserted token costs its id and a
  bit, 4.125 bytes. Every array that describes sampled tokens (`behavior_logp`,
  `token_versions`, the kept sets) holds one entry per sampled token only, in order: an
  inserted token has no behaviour log-prob, version or kept set, and is never trained. Each
  episode starts with a sampled token (the environment's opening messages are the prompt). A
  group of single-turn completions leaves `sampled_bits` out (`Group.OMIT_EMPTY`): every token
  sampled, no extra byte. `finish_reasons` says how each episode ended (`EPISODE_ENDS`); an
  episode that an environment failure ended (`env_error`) is never trained (consumer/train/
  batching.py). `env_s`: the group's wall seconds inside its environment.
- Truncated sampling (`RunSpec.top_p < 1`, `top_k > 0` or `min_p > 0`): every sampled token's kept
  set travels with the group, `kept_counts` uint8 [sum L_i] (each token's kept ids other than
  itself: |K| - 1) and `kept_ids` int32 (those ids, ascending, token after token), `kept_unknown`
  int32 (tokens whose set the engine could not record: never trained); `behavior_logp` is log q over
  the kept set. The encoding and its rule: common/sampling/kept_set.py. Without truncation the three
  are empty and left out of the message (`Group.OMIT_EMPTY`): an untruncated group costs no extra
  byte.
- `reward_parts`: each reward function's own (unweighted) score of each completion, float32
  [F * G] function-major (function k's G scores at k*G..k*G+G-1, k in the order of
  `RunSpec.reward_fns`), so the consumer reports per-function means; `rewards` stays their
  weighted sum. Empty (and left out) when the producer scores with something else (the fake
  engine's coins). `reward_error`: the first failed reward call of the group in one line (the
  reward, the exception, its message and the line that raised it; at most
  `MAX_REWARD_ERROR_CHARS`), "" and left out when none failed, so a consumer whose groups carry
  no signal can say why without the producers' logs.
- Evaluation during training (consumer/evaluation/rounds.py): an eval lease has
  `eval_version` >= 0 (-1 on a training lease): its group must be sampled entirely with
  exactly that version (`RunSpec.eval_samples` completions at `RunSpec.eval_temperature`; 0 =
  greedy), sent with `Group.evaluation` set, and is never trained; it is acknowledged
  `EVALUATED` (or `expired`, too late). A producer that no longer holds that version when the
  lease arrives gives it back, unsampled, in its next `lease_req` (`declined`). An eval group
  carries no kept sets and no per-token versions (one version by construction). Every status
  names the version a round still has prompts to lease for (`Status.eval_version`), or, before
  the round has one, the version from which a producer may give it its own (`eval_from`): a
  producer holding it (or, for `eval_from`, any newer one) defers its reloads and asks for up to
  `max_eval_leases` eval leases on top of its training slots until the round is leased.
- Heartbeats (common/net/heartbeat.py): every status names the period at which the consumer wants
  heartbeats (`Status.heartbeat_s`, seconds, positive and finite: `check_status`), longer with
  more live producers so that all of them together send at most `net.max_heartbeats_per_s`;
  a producer beats at the period it heard last, and each side tolerates silences of three
  such periods or its configured timeout, whichever is longer. A lease request that cannot be
  granted waits at the consumer for leases to free up: `net.lease_wait_s`, or longer when the
  producer says it waits longer (`LeaseRequest.wait_s`, seconds, finite, in [0,
  `MAX_LEASE_WAIT_S`]: `check_lease_request`; a crowd of starved producers waits there rather
  than polling: common/net/heartbeat.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

import numpy as np

from common.sampling.kept_set import KeptSets, from_counts
from common.wire.fetch import (
    ChunkHead,
    FetchDone,
    FetchPlan,
    FetchRequest,
    FileChunkRequest,
)
from common.wire.spec import RunSpec

SCHEMA_VERSION = 9  # 9: episodes: Group.sampled_bits (sampled vs inserted tokens), arrays of
# sampled tokens only, Group.env_s, episode finish reasons, RunSpec.episodes
# 8: a group names its first failed reward call (Group.reward_error); the
# run spec lists the model directory's files, which a producer with no copy fetches
# (RunSpec.model_files, `file_chunk_req` of file "model/NAME")
# 7: the consumer sets the heartbeat period (Status.heartbeat_s); a lease
# request may wait longer than net.lease_wait_s (LeaseRequest.wait_s)
# 6: evaluation leases and groups (Lease.eval_version, Group.evaluation,
# LeaseRequest.declined / max_eval_leases, RunSpec.eval_samples / eval_temperature,
# Status.eval_version / eval_from)
# 5: each reward function's scores travel with the group (Group.reward_parts)
# 4: a kept set's size in one byte per token (Group.kept_counts)
# 3: kept sets of truncated sampling (Group.kept_*, RunSpec.min_p/max_kept); a lease carries a
# chat prompt (`messages`) and the row's `columns`
# 2: snapshot chunks moved to the data socket (`chunk_head` + bytes)
MAX_LEASE_WAIT_S = 600.0  # the longest `LeaseRequest.wait_s`
MAX_REWARD_ERROR_CHARS = 400  # the longest `Group.reward_error`
# How a completion ended: the engine's reasons; then an episode's (producer/episodes/loop.py):
# its environment ended it (`stop`), or `max_turns`, `max_tokens` (max_episode_tokens) stopped it,
# or its environment failed (`env_error`: raised, timed out, returned no messages, or messages
# that do not fit the episode's token budget)
FINISH_REASONS = ("stop", "length", "abort", "max_turns", "max_tokens", "env_error")
OUTCOMES = (
    "trained",
    "dropped_stale",
    "dropped_zero_variance",
    "rejected_invalid",
    "expired",
)
# Acks that are not outcomes (the lease stays open): the consumer had no room for the group, so
# its producer keeps it (`hold`), until told to send it again (`send`):
# consumer/server/admission.py.
HOLD, SEND = "hold", "send"
# The ack of an evaluation group that was counted (eval leases are not in the training ledger:
# consumer/evaluation/rounds.py); a late one is acked `expired`.
EVALUATED = "evaluated"
# Why a fetcher dropped a relay (`BadSource.reason`); the consumer counts any other reason as
# `other` (consumer/snapshots/fanout.py)
_ARRAY_DTYPES: dict[str, np.dtype[Any]] = {  # fields of `Group` only
    "prompt_ids": np.dtype("<i4"),
    "completion_ids": np.dtype("<i4"),
    "completion_lens": np.dtype("<i4"),
    "token_versions": np.dtype("<i4"),
    "behavior_logp": np.dtype("<f4"),
    "rewards": np.dtype("<f4"),
    "kept_counts": np.dtype("u1"),
    "kept_ids": np.dtype("<i4"),
    "kept_unknown": np.dtype("<i4"),
    "reward_parts": np.dtype("<f4"),
    "sampled_bits": np.dtype("u1"),
}


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
    # the version an evaluation round still has prompts to lease for (-1: none): a producer that
    # holds it keeps it until they are leased (consumer/evaluation/rounds.py)
    eval_version: int = -1
    # a round that has no version yet waits for its first producer holding this one or newer
    # (-1: none); that producer keeps its version and asks for the round
    eval_from: int = -1
    # the period, in seconds, at which the consumer asks this producer to heartbeat: longer
    # with more live producers (common/net/heartbeat.py); the producer beats at the one it heard
    # last
    heartbeat_s: float = 1.0


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """One message of a chat prompt (rendered by the producer with the chat template)."""

    role: str
    content: str


@dataclass(frozen=True, slots=True)
class Lease:
    """One prompt to sample a group for, and what its rewards read of the prompt's row."""

    lease_id: int
    prompt_index: int
    step: int  # the optimizer step this prompt is meant for
    min_version: int  # start generating only with weights of at least this version
    prompt: str  # the prompt text; "" when `messages` holds the prompt
    answer: str  # the reference answer ("" when the task has none)
    messages: tuple[ChatTurn, ...]  # a chat prompt; () when `prompt` holds the text
    columns: str  # the row's other columns, a JSON object's text ("" when there are none)
    eval_version: int = -1  # >= 0: an eval lease, sampled with exactly this version (not trained)


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
    declined: tuple[int, ...] = ()  # eval leases given back unsampled (that version is gone)
    max_eval_leases: int = 0  # eval leases it takes beyond `max_leases` (it holds a round's
    # version: `Status.eval_version`); 0: eval leases come out of `max_leases`
    wait_s: float = 0.0  # seconds it waits for the reply at the consumer if nothing is free:
    # the consumer answers empty after max(net.lease_wait_s, this); 0: net.lease_wait_s


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
    OMIT_EMPTY: ClassVar[tuple[str, ...]] = (
        "kept_counts",
        "kept_ids",
        "kept_unknown",
        "reward_parts",
        "reward_error",
        "sampled_bits",
    )
    lease_id: int
    producer_id: str
    prompt_index: int
    behavior_version: int
    prompt_ids: np.ndarray  # int32 [P]
    completion_ids: np.ndarray  # int32 [sum L_i]
    completion_lens: np.ndarray  # int32 [G]
    behavior_logp: np.ndarray  # float32 [S], log-probs of the S sampled tokens (<= 0)
    token_versions: np.ndarray  # int32 [S], or [0] when every token has behavior_version
    rewards: np.ndarray  # float32 [G]
    finish_reasons: tuple[str, ...]  # G entries of FINISH_REASONS
    temperature: float
    num_reward_errors: int = 0
    gen_s: float = 0.0  # wall seconds from lease start to the last completion
    kept_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))  # [sum L]
    kept_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    kept_unknown: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    # float32 [F*G], function-major: each reward function's own score (empty: not sent)
    reward_parts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    evaluation: bool = False  # an eval lease's group: never trained (consumer/evaluation/rounds.py)
    # the first of its failed reward calls, in one line (at most MAX_REWARD_ERROR_CHARS; "" when
    # none failed): what the consumer shows when no group carries a learning signal
    reward_error: str = ""
    # uint8 [ceil(sum L_i / 8)]: 1 bit per token, 1 = sampled (empty: every token sampled)
    sampled_bits: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    env_s: float = 0.0  # wall seconds the group's episodes spent in their environment

    @property
    def group_size(self) -> int:
        return len(self.completion_lens)

    @property
    def kept(self) -> KeptSets:
        """The kept sets of all S sampled tokens (empty without truncation)."""
        return from_counts(self.kept_counts, self.kept_ids, self.kept_unknown)

    @property
    def num_tokens(self) -> int:
        """Tokens after the prompt, sampled and inserted."""
        return len(self.completion_ids)

    @property
    def num_sampled(self) -> int:
        """Tokens the model sampled (S): those that carry a log-prob and may be trained."""
        return len(self.behavior_logp)

    @property
    def episodes(self) -> bool:
        """Whether the completions are episodes with inserted tokens (`sampled_bits` sent)."""
        return len(self.sampled_bits) > 0

    def sampled_mask(self) -> np.ndarray:
        """bool [sum L_i]: True where the model sampled the token (all True for completions)."""
        if not self.episodes:
            return np.ones(len(self.completion_ids), bool)
        bits = np.unpackbits(self.sampled_bits, count=len(self.completion_ids), bitorder="little")
        return bits.astype(bool)

    def turns(self) -> np.ndarray:
        """int64 [G]: model turns per completion, each a run of sampled tokens (1 for a
        completion without inserted tokens)."""
        mask = self.sampled_mask()
        starts = np.zeros(len(mask), bool)
        starts[1:] = mask[1:] & ~mask[:-1]
        first = np.cumsum(self.completion_lens, dtype=np.int64) - self.completion_lens
        starts[first] = mask[first]  # every completion's first token is sampled (checked)
        bounds = np.concatenate([[0], np.cumsum(self.completion_lens, dtype=np.int64)])
        return np.add.reduceat(starts, bounds[:-1]).astype(np.int64) if len(mask) else bounds[1:]

    def reward_parts_FG(self) -> np.ndarray:
        """`reward_parts` as float32 [F, G] (F = 0 when the producer sent none)."""
        return self.reward_parts.reshape(-1, self.group_size)

    def _spans(self, i: int, mask: np.ndarray | None = None) -> tuple[int, int, int, int]:
        """(start, stop) of completion `i` in `completion_ids`, and in the sampled arrays."""
        start = int(self.completion_lens[:i].sum())
        stop = start + int(self.completion_lens[i])
        if not self.episodes:
            return start, stop, start, stop
        mask = self.sampled_mask() if mask is None else mask
        first = int(mask[:start].sum())
        return start, stop, first, first + int(mask[start:stop].sum())

    def completion(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of completion `i` (all of them) and the behaviour log-probs of its sampled
        tokens (views)."""
        start, stop, first, last = self._spans(i)
        return self.completion_ids[start:stop], self.behavior_logp[first:last]

    def completion_sampled(self, i: int) -> np.ndarray:
        """bool [L_i]: which tokens of completion `i` the model sampled."""
        start, stop, _, _ = self._spans(i)
        return self.sampled_mask()[start:stop]

    def completion_kept(self, i: int) -> KeptSets:
        """The kept sets of completion `i`'s sampled tokens (offsets rebased; empty when
        untruncated)."""
        _, _, first, last = self._spans(i)
        return self.kept.slice(first, last)


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
