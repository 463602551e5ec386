"""One row of the user's data, checked: what a lease carries of it (pure; no I/O).

A row is a mapping of column names to values (a JSON object, a Parquet or Hugging Face dataset
row); `row_of` turns it into a `PromptRow` or raises one `ConfigError` that names the row
(`where`: the file and the row or line) and the field:
- the prompt (`task.prompt_field`): text, or a chat conversation, a list of messages each with a
  text `role` and `content` (rendered by the producer with the tokenizer's chat template);
  missing, of another type, or empty (no text, no message, whitespace only) is refused;
- the answer (`task.answer_field`, none when that key is empty): text, or a number (written as
  text: 42 -> "42", 0.5 -> "0.5"); missing, null or of another type is refused;
- every other column goes to the reward functions by name, as JSON values: text, numbers,
  booleans, null, lists and maps (text keys) of them; NumPy scalars and arrays become numbers
  and lists, dates and times ISO text, decimals floats. Anything else (bytes, images) is
  refused, and so is a column named like a reward argument (`RESERVED`: `prompt`,
  `completion`, `completions`, `answer`) that is not the prompt or answer field itself;
- the whole row (prompt, answer and columns, UTF-8) must fit in `max_row_bytes`
  (`task.max_row_kib`): leases carry it to the producers, in messages of bounded size.
"""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from common import wire
from common.errors import ConfigError

RESERVED = ("prompt", "completion", "completions", "answer")  # reward arguments (rewards.py)


@dataclass(frozen=True, slots=True)
class PromptRow:
    """What a lease carries of one row (`wire.Lease`'s fields of the same names)."""

    prompt: str  # the prompt text; "" when `messages` holds the prompt
    answer: str  # the reference answer ("" when the task has none)
    messages: tuple[wire.ChatTurn, ...] = ()  # a chat prompt
    columns: str = ""  # the other columns, a JSON object's text ("" when there are none)

    @property
    def num_bytes(self) -> int:
        """The row's size as a lease carries it (UTF-8 of every text)."""
        texts = [self.prompt, self.answer, self.columns]
        texts += [t for turn in self.messages for t in (turn.role, turn.content)]
        return sum(len(t.encode()) for t in texts)


@dataclass(frozen=True, slots=True)
class RowFields:
    """How to read a row: the columns holding the prompt and the answer, the size limit."""

    prompt_field: str
    answer_field: str  # "" = the task has no answer
    max_row_bytes: int


def row_of(record: Mapping[str, Any], where: str, fields: RowFields) -> PromptRow:
    """The checked `PromptRow` of `record`; `ConfigError` naming `where` and the field."""
    if not isinstance(record, Mapping):
        raise ConfigError(f"{where}: a row must be an object of named fields, not {_kind(record)}")
    prompt, messages = _prompt(record, where, fields.prompt_field)
    answer = _answer(record, where, fields.answer_field) if fields.answer_field else ""
    other = {}
    for name, value in record.items():
        if name in (fields.prompt_field, fields.answer_field):
            continue
        if not isinstance(name, str):
            raise ConfigError(f"{where}: a field name must be text, not {name!r}")
        if name in RESERVED:
            raise ConfigError(
                f"{where}: field {name!r} has the name of a reward argument "
                f"({', '.join(RESERVED)}); rename it, or name it in task.prompt_field / "
                "task.answer_field"
            )
        other[name] = _plain(value, where, name)
    columns = json.dumps(other, ensure_ascii=False, separators=(",", ":")) if other else ""
    row = PromptRow(prompt, answer, messages, columns)
    if row.num_bytes > fields.max_row_bytes:
        raise ConfigError(
            f"{where}: the row takes {row.num_bytes / 1024:.1f} KiB, over task.max_row_kib = "
            f"{fields.max_row_bytes / 1024:g}"
        )
    return row


def _prompt(
    record: Mapping[str, Any], where: str, field: str
) -> tuple[str, tuple[wire.ChatTurn, ...]]:
    if field not in record:
        raise ConfigError(
            f"{where}: no field {field!r} (task.prompt_field); the row has {_names(record)}"
        )
    value = record[field]
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(f"{where}: field {field!r} is empty (a prompt needs text)")
        return value, ()
    if isinstance(value, np.ndarray):  # a list column of a Parquet file read through pandas
        value = value.tolist()
    if not isinstance(value, list | tuple):
        raise ConfigError(
            f"{where}: field {field!r} is {_kind(value)}; a prompt is text or a list of chat "
            "messages ({role, content})"
        )
    turns = []
    for i, message in enumerate(value):
        role = message.get("role") if isinstance(message, Mapping) else None
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(role, str) or not role or not isinstance(content, str):
            raise ConfigError(
                f"{where}: field {field!r}, message {i}: a chat message is an object with a "
                f"text 'role' and 'content', not {_short(message)}"
            )
        turns.append(wire.ChatTurn(role, content))
    if not any(t.content.strip() for t in turns):
        raise ConfigError(f"{where}: field {field!r} is empty (no message has any text)")
    return "", tuple(turns)


def _answer(record: Mapping[str, Any], where: str, field: str) -> str:
    if field not in record:
        raise ConfigError(
            f"{where}: no field {field!r} (task.answer_field; set it to '' if the task has no "
            f"answer); the row has {_names(record)}"
        )
    value = record[field]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{where}: field {field!r} is {_kind(value)}; an answer is text or a number")


def _plain(value: Any, where: str, name: str) -> Any:
    """`value` as JSON values (see the module doc); `ConfigError` for anything else."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, np.generic | np.ndarray):
        return _plain(value.tolist(), where, name)
    if isinstance(value, list | tuple):
        return [_plain(v, where, name) for v in value]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{where}: field {name!r} holds a map whose keys are not all text")
        return {k: _plain(v, where, name) for k, v in value.items()}
    if isinstance(value, datetime.date | datetime.time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    raise ConfigError(
        f"{where}: field {name!r} holds {_kind(value)}, which rewards cannot receive (text, "
        "numbers, booleans, null, and lists and maps of them)"
    )


def _kind(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


def _names(record: Mapping[str, Any]) -> str:
    names = [str(k) for k in record][:12]
    return ", ".join(repr(n) for n in names) + (", ..." if len(record) > 12 else "") or "none"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
