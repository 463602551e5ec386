"""What a recorded stream says besides the groups: one `StepEntry` per optimizer step and one
`SnapshotEntry` per published snapshot (JSON payloads of consumer/stream/segments.py records).

A step's result is a function of the learner's state before it, the config and the groups it
trained in their order; a `StepEntry` holds the last of these (lease ids: common.wire.Group's
`lease_id`, unique over a run and its resumes) and what a replay checks the first two against:
the seed, the micro-batch passes the trainer made (`train.micro_batch_tokens` and the attention
path decide them), the torch threads of each pass (what a replay runs them with) and the
learning rate it used. The groups dropped while collecting the step
are listed with why (common.wire.OUTCOMES names), so a replay's ledger counts them too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class StepEntry:
    """One optimizer step: from policy version `version` to `version + 1`."""

    version: int
    kept: tuple[int, ...]  # lease ids, in the order the trainer saw them
    dropped: tuple[tuple[int, str], ...] = ()  # (lease id, outcome) while collecting it
    seed: int = 0  # run.seed
    micro_batches: int | None = None  # forward/backward passes the trainer made
    lr: float | None = None  # the learning rate the step (its first update) used
    tokens: int = 0  # completion tokens of the kept groups (the stream's bytes per token)
    # torch threads of each unit in order: a forward/backward pass's start and, on a CPU, each
    # decoder layer's forward and backward (a CPU learner's threads follow its host's cores and
    # change the float rounding: a replay runs its units with the same)
    threads: tuple[int, ...] = ()
    # True when `threads` has the decoder layers' units too; False: one entry per pass (a
    # recording made before the layers took threads, replayed that way)
    layer_threads: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # fields of later formats, kept as is

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "version": self.version,
                "kept": list(self.kept),
                "dropped": [list(d) for d in self.dropped],
                "seed": self.seed,
                "micro_batches": self.micro_batches,
                "lr": self.lr,
                "tokens": self.tokens,
                **({"threads": list(self.threads)} if self.threads else {}),
                **({"layer_threads": True} if self.layer_threads else {}),
                **self.extra,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> StepEntry:
        """Parse; `ValueError` (or KeyError, TypeError) when `data` is not a step entry."""
        d = json.loads(data)
        known = {"version", "kept", "dropped", "seed", "micro_batches", "lr", "tokens", "threads"}
        known.add("layer_threads")
        return cls(
            version=int(d["version"]),
            kept=tuple(int(i) for i in d["kept"]),
            dropped=tuple((int(i), str(why)) for i, why in d.get("dropped", [])),
            seed=int(d.get("seed", 0)),
            micro_batches=d.get("micro_batches"),
            lr=d.get("lr"),
            tokens=int(d.get("tokens", 0)),
            threads=tuple(int(n) for n in d.get("threads", [])),
            layer_threads=bool(d.get("layer_threads", False)),
            extra={k: v for k, v in d.items() if k not in known},
        )


@dataclass(frozen=True, slots=True)
class SnapshotEntry:
    """A published snapshot: its version and the BLAKE3 hex of its `model.safetensors`."""

    version: int
    hash: str

    def to_bytes(self) -> bytes:
        return json.dumps({"version": self.version, "hash": self.hash}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> SnapshotEntry:
        d = json.loads(data)
        return cls(version=int(d["version"]), hash=str(d["hash"]))
