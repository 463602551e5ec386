"""`completions.jsonl` in the run directory: samples of what the policy wrote, to read.

Every `log.completions_every` steps the learner hands its logger thread the first
`log.completions_groups` groups that arrived for the step (kept or dropped); each completion of
each becomes one line, a `CompletionRow`: the step (= the policy version after it), the
prompt's index and text, the completion's text, its reward and each reward function's own
score, its length in tokens, finish reason and the weights version that sampled it. Texts are
the tokenizer's decoding with special tokens kept (a `<unk>` shows what the model could not
read). A multi-turn run's completion is its whole episode after the prompt, the environment's
tokens between `⟦` and `⟧` (`ENV_OPEN`, `ENV_CLOSE`), with its model turns (`turns`) and the
tokens the model sampled (`sampled`) of its `length`; a single completion has 1 turn and every
token sampled. `asyncgrpo report` shows the newest sample in summary.md; the trackers get it
as a table (consumer/loggers/). One typed reader and writer here; nobody indexes the lines by
string.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import wire

COMPLETIONS = "completions.jsonl"
COLUMNS = (
    "step",
    "prompt_index",
    "behavior_version",
    "prompt",
    "completion",
    "reward",
    "rewards",
    "length",
    "finish_reason",
    "turns",
)
ENV_OPEN, ENV_CLOSE = "⟦", "⟧"  # around an environment's tokens in an episode's text


@dataclass(frozen=True, slots=True)
class CompletionRow:
    step: int  # policy version after the step the group arrived for
    prompt_index: int
    behavior_version: int  # the oldest weights version that sampled any of its tokens
    prompt: str
    completion: str
    reward: float  # the weighted sum the learner trains on
    rewards: dict[str, float]  # each reward function's own score ({} without them)
    length: int  # tokens
    finish_reason: str  # common.wire.FINISH_REASONS
    turns: int = 1  # model turns (an episode's; 1 for a completion)
    sampled: int | None = None  # tokens the model sampled (None: all of them)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def rows_of(
    groups: Sequence[wire.Group],
    *,
    step: int,
    decode: Callable[[Sequence[int]], str],
    reward_names: Sequence[str],
) -> list[CompletionRow]:
    """One row per completion of `groups` (texts by `decode`, token ids to text)."""
    out = []
    for g in groups:
        prompt = decode(g.prompt_ids.tolist())
        parts = g.reward_parts_FG()
        names = list(reward_names) if len(parts) == len(reward_names) else []
        turns = g.turns()
        for i in range(g.group_size):
            ids, _ = g.completion(i)
            mask = g.completion_sampled(i)
            out.append(
                CompletionRow(
                    step=step,
                    prompt_index=g.prompt_index,
                    behavior_version=g.behavior_version,
                    prompt=prompt,
                    completion=episode_text(ids, mask, decode),
                    reward=float(g.rewards[i]),
                    rewards={n: float(parts[k, i]) for k, n in enumerate(names)},
                    length=int(g.completion_lens[i]),
                    finish_reason=g.finish_reasons[i],
                    turns=int(turns[i]),
                    sampled=int(mask.sum()) if g.episodes else None,
                )
            )
    return out


def episode_text(ids: Any, sampled: Any, decode: Callable[[Sequence[int]], str]) -> str:
    """The text of a completion's `ids`, each run of inserted tokens (`sampled` False) decoded
    on its own between `ENV_OPEN` and `ENV_CLOSE`."""
    parts, start = [], 0
    for stop in [*(i for i in range(1, len(ids)) if sampled[i] != sampled[i - 1]), len(ids)]:
        text = decode(ids[start:stop].tolist())
        parts.append(text if sampled[start] else ENV_OPEN + text + ENV_CLOSE)
        start = stop
    return "".join(parts)


def append(run_dir: Path, rows: Sequence[CompletionRow]) -> None:
    """Append `rows` to the run's completions.jsonl (one JSON object per line)."""
    with open(run_dir / COMPLETIONS, "a") as f:
        f.writelines(json.dumps(r.to_json(), sort_keys=True) + "\n" for r in rows)


def read(run_dir: Path) -> list[CompletionRow]:
    """Every row of the run's completions.jsonl (none without the file; a torn line skipped)."""
    path = run_dir / COMPLETIONS
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(CompletionRow(**json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue
    return out


def keep_through(run_dir: Path, step: int) -> int:
    """Drop the rows of steps after `step`, and a torn last line: a run resumed from its
    checkpoint of version `step` continues from there, as its metrics.jsonl does. The file is
    replaced atomically; returns the number of lines dropped."""
    path = run_dir / COMPLETIONS
    if not path.exists():
        return 0
    lines = path.read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if _step_of(line) <= step]
    if len(kept) < len(lines):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(kept))
        os.replace(tmp, path)
    return len(lines) - len(kept)


def _step_of(line: bytes) -> float:
    """A whole line's step (a torn or foreign line: infinity, so it is dropped)."""
    try:
        step = json.loads(line)["step"] if line.endswith(b"\n") else None
    except (ValueError, TypeError, KeyError):
        step = None
    return step if isinstance(step, int) else float("inf")


def markdown_table(rows: Sequence[CompletionRow], max_chars: int = 300) -> str:
    """A Markdown table of `rows` (texts shortened to `max_chars`, `|` and newlines escaped)."""

    def cell(value: Any) -> str:
        text = json.dumps(value, sort_keys=True) if isinstance(value, dict) else str(value)
        if len(text) > max_chars:
            text = text[:max_chars] + "…"
        return text.replace("|", "\\|").replace("\n", "⏎")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(cell(getattr(row, c)) for c in COLUMNS) + " |")
    return "\n".join(lines)
