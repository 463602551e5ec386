"""Metric names both sides log, and the JSONL sink.

`metrics.jsonl` in the run directory has one JSON object per optimizer step (written by the
learner). Keys used by reports and plots are named here once; a line may carry more keys.
Values are numbers, or small dicts of numbers (histograms, per-producer views).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

STEP = "step"
TIME = "time_s"  # seconds since the learner started
REWARD_MEAN = "reward_mean"
REWARD_STD = "reward_std"
FRAC_ZERO_STD = "frac_reward_zero_std"
STALENESS_MEAN = "staleness_mean"
STALENESS_MAX = "staleness_max"
STALENESS_HIST = "staleness_hist"  # {lag: number of trained groups}
TIS_MEAN = "tis_weight_mean"
TIS_TRUNCATED = "tis_frac_truncated"
TOKENS_PER_S = "tokens_per_s"
IDLE_FRAC = "learner_idle_frac"
HELDOUT_ACC = "heldout_accuracy"


class JsonlWriter:
    """Append-only JSON lines, flushed per line (a crash loses at most the line being written)."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 (closed by close())

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(_finite(record), sort_keys=True) + "\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a torn last line (crash mid-write) is skipped."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _finite(value: Any) -> Any:
    """NaN/inf become None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
