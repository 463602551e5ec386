"""Tools an environment dispatches: plain Python functions, described to the model, called when
the model asks.

- `describe(tools)`: the plain tool format, for a chat template that takes no tools (SmolLM2's
  ChatML) or a raw prompt: one system text naming each tool with its signature and the first
  line of its docstring, and how to call one: `<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>`, the format of the templates that do take tools (Qwen2.5's, Hermes'). With such a
  template the tools go through its own `tools` argument instead (producer/episodes/render.py).
- `tool_calls(text)`: the calls in an assistant message, in order: each `<tool_call>` block
  holding a JSON object with a string `name` and an object `arguments`; a block that is not one
  is a call named "" (answered with an error, so the model sees what was wrong).
- `dispatch(text, tools)`: the tool messages (`{"role": "tool", "content": ...}`) answering the
  calls in `text`, or None when it makes none. A tool that raises, an unknown name or bad
  arguments is answered `error: ...`: the model's mistake is the episode's content, not the
  environment's failure. Results are `str()`-ed and cut to `MAX_RESULT_CHARS`.
- `python(code)`: the built-in Python tool, a tool like any other: the model's program run in
  the sandbox (producer/sandbox/: its own process, time, memory, process and output limits, no
  network, nothing of the host readable) under `PYTHON_LIMITS`; what it prints comes back, or
  `error (REASON): ...` with the sandbox's reason (`timeout`, `memory`, ...) and the end of its
  stderr.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from producer.sandbox import Limits, run_python

MAX_RESULT_CHARS = 2000
PYTHON_LIMITS = Limits(wall_s=3.0, cpu_s=3.0, memory_mib=256, max_output_bytes=64 << 10)
_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def describe(tools: Sequence[Callable[..., Any]]) -> str:
    """The plain-format description of `tools` (module docstring)."""
    lines = [
        "You can call these tools. To call one, write",
        '<tool_call>{"name": "NAME", "arguments": {"ARG": VALUE}}</tool_call>',
        "and its result comes back in the next message.",
        "Tools:",
    ]
    for fn in tools:
        doc = (inspect.getdoc(fn) or "").splitlines()
        lines.append(f"- {fn.__name__}{_signature(fn)}: {doc[0] if doc else ''}".rstrip())
    return "\n".join(lines)


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    """`fn`'s signature with its annotations as types (`from __future__ import annotations`
    leaves them strings), or as written when they cannot be evaluated."""
    try:
        return inspect.signature(fn, eval_str=True)
    except (NameError, TypeError, SyntaxError):
        return inspect.signature(fn)


def tool_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments) of every call in `text` (module docstring)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for block in _CALL.findall(text):
        try:
            call = json.loads(block.strip())
        except ValueError:
            out.append(("", {}))
            continue
        name = call.get("name") if isinstance(call, dict) else None
        args = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(name, str) and isinstance(args, dict):
            out.append((name, args))
        else:
            out.append(("", {}))
    return out


def dispatch(text: str, tools: Sequence[Callable[..., Any]]) -> list[dict[str, str]] | None:
    """The tool messages answering the calls in `text`, or None (module docstring)."""
    calls = tool_calls(text)
    if not calls:
        return None
    by_name = {fn.__name__: fn for fn in tools}
    out = []
    for name, args in calls:
        fn = by_name.get(name)
        if fn is None:
            known = ", ".join(by_name)
            result = f"error: no tool {name!r}" if name else "error: not a tool call"
            result += f" (tools: {known})"
        else:
            try:
                result = str(fn(**args))
            except Exception as exc:  # the model's arguments, the tool's error: its answer
                result = f"error: {type(exc).__name__}: {exc}"
        out.append({"role": "tool", "content": result[:MAX_RESULT_CHARS]})
    return out


def python(code: str) -> str:
    """Run a Python program and return what it prints."""
    run = run_python(code, limits=PYTHON_LIMITS)
    if run.ok:
        return run.stdout
    return f"error ({run.reason}): {(run.stderr or run.stdout).strip()[-500:]}"
