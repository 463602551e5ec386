"""Live progress of a run, read from its files (the processes are never asked).

`MetricsTail` follows `metrics.jsonl` by file offset (a torn last line is read again next time)
and keeps its lines as `common.metrics.StepRecord`s.
`render(...)` builds one rich renderable: a progress bar of steps, the newest learner metrics,
the ledger, and one row per producer (weight version, state, restarts). On a terminal the
launcher shows it with `rich.live.Live`; otherwise it prints one plain line every few seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table

from common.metrics import StepRecord


class MetricsTail:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self.records: list[StepRecord] = []

    def poll(self) -> list[StepRecord]:
        """New complete records since the last call."""
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self._offset)
            chunk = f.read()
        lines = chunk.split("\n")
        new = []
        for line in lines[:-1]:  # the last element is "" or a line still being written
            self._offset += len(line.encode()) + 1
            if line.strip():
                new.append(StepRecord.from_json(json.loads(line)))
        self.records.extend(new)
        return new


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def summary_line(rec: StepRecord | None, steps: int, elapsed_s: float) -> str:
    if rec is None:
        return f"[{elapsed_s:6.0f}s] waiting for the first step…"
    acc = rec.heldout_accuracy
    return (
        f"[{elapsed_s:6.0f}s] step {rec.step}/{steps} reward {rec.reward_mean:.3f}"
        + (f" heldout {acc:.3f}" if acc is not None else "")
        + f" staleness {rec.staleness_mean:.2f}/{rec.staleness_max}"
        + f" tok/s {rec.tokens_per_s:.0f} idle {rec.learner_idle_frac:.2f}"
    )


def render(tail: MetricsTail, *, steps: int, elapsed_s: float, restarts: dict[str, int]) -> Group:
    rec = tail.records[-1] if tail.records else None
    done = rec.step if rec else 0
    acc = next(
        (r.heldout_accuracy for r in reversed(tail.records) if r.heldout_accuracy is not None),
        None,
    )
    window = tail.records[-10:]
    span = window[-1].time_s - window[0].time_s if len(window) > 1 else 0.0
    groups_per_s = (
        (window[-1].groups_trained - window[0].groups_trained) / span if span > 0 else None
    )
    top = Table.grid(padding=(0, 2))
    top.add_row("step", f"{done}/{steps}", "elapsed", f"{elapsed_s:.0f} s")
    if rec is not None:
        top.add_row("reward", _fmt(rec.reward_mean), "held-out accuracy", _fmt(acc))
        top.add_row(
            "staleness mean/max",
            f"{rec.staleness_mean:.2f} / {rec.staleness_max}",
            "learner idle",
            _fmt(rec.learner_idle_frac, ".2f"),
        )
        top.add_row(
            "groups/s", _fmt(groups_per_s, ".2f"), "tokens/s", _fmt(rec.tokens_per_s, ".0f")
        )
        top.add_row(
            "TIS weight mean",
            _fmt(rec.tis_weight_mean),
            "clip fraction",
            _fmt(rec.clip_frac_high),
        )
        top.add_row(
            "ledger",
            f"trained {rec.groups_trained} · "
            f"stale {rec.groups_dropped_stale} · "
            f"zero-var {rec.groups_dropped_zero_variance} · "
            f"expired {rec.groups_expired}",
            "",
            "",
        )
    prods = Table("producer", "weights", "state", "restarts", box=None, pad_edge=False)
    for name, view in sorted((rec.producers if rec else {}).items()):
        prods.add_row(
            name, f"v{view.get('version')}", str(view.get("state")), str(restarts.get(name, 0))
        )
    bar = ProgressBar(total=max(steps, 1), completed=done, width=60)
    return Group(Panel(Group(bar, top), title="asyncgrpo"), prods)
