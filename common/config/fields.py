"""How a config field is declared: its default and help (`_f`), its modes, its checks.

Every field's help text is written once, in its `metadata["help"]`, and reused by `--help`,
`asyncgrpo config show` and docs/config.md (`asyncgrpo config docs`). A field with a fixed
set of values has a `Literal` type declared here once (`AdvScale`, `TISMode`, ...): the loss
and the engines use the same type, and its values are the choices `--help` lists and loading
enforces. A section's `problems()` lists its impossible settings with `failed`, each check a
`(holds, message)` pair whose message names the key and says why.
"""

from __future__ import annotations

import typing
from dataclasses import field
from typing import Any, Literal

# The modes: each declared once, used by the config fields and by the code they select.
ModelDtype = Literal["float32", "bfloat16"]
ReduceDtype = Literal["float32", "bfloat16"]
LearnerAttention = Literal["auto", "flash", "flex", "sdpa_packed", "padded", "shared_prompt"]
TaskSource = Literal["synthetic", "jsonl", "parquet", "hf"]
LRSchedule = Literal["constant", "linear", "cosine"]
PromptFormat = Literal["raw", "chat"]
EvalMode = Literal["greedy", "sampled"]
AdvScale = Literal["group", "batch", "none"]
AdvBaseline = Literal["group", "leave-one-out", "group-whiten", "batch-whiten"]
RatioLevel = Literal["token", "sequence"]
Objective = Literal["ppo", "gmpo", "cispo"]
TISLevel = Literal["token", "sequence"]
TISMode = Literal["truncate", "mask"]
AggMode = Literal[
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
]
KLKind = Literal["k1", "k2", "k3"]
SnapshotDtype = Literal["bfloat16", "float32"]
SnapshotFsync = Literal["before_announce", "after_announce", "off"]
EngineName = Literal["hf", "vllm", "fake"]


def choices(tp: Any) -> tuple[Any, ...]:
    """The values of a `Literal` type (empty for any other type)."""
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else ()


def _meta(help: str) -> dict[str, Any]:
    return {"help": help}


def _f(default: Any, help: str) -> Any:
    """A field with `default` (lists and dicts copied per instance) and its help text."""
    meta = _meta(help)
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def failed(*checks: tuple[bool, str]) -> list[str]:
    """The messages of the checks that do not hold, in order (each check `(holds, message)`)."""
    return [message for holds, message in checks if not holds]
