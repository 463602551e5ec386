"""What tests/unit/test_hints.py checks in the messages the product prints: the hints they give.

A hint is any string in the product's code (docstrings excepted: they are for readers of the
code) that names a command-line option (`--resume`) or quotes a command (`asyncgrpo keys DIR`).
Every quoted `asyncgrpo ...` command must parse against the CLI (tests/docs_check.py
`command_problems`, an inline mention: an option may stand without its value), and every other
option named (outside a quoted command of another program, `torchrun --standalone`; a string
that is just an option is a declaration or an argument) must exist on every command that can
show the message (`SHOWN_BY`: a module's
messages reach the user through these commands; the rest through any command). So "pass
--resume" in launch/run_dir.py, which both `launch` and `consumer` show, needs `--resume` on
both, and a config check in common/ may name only what every command that reads a config has
(`--config`, `--set`: it names the key instead).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from docs_check import CLI, PACKAGES, ROOT, command_problems

OPTION = re.compile(r"(?<![\w-])--[a-z][\w-]*")
QUOTED = re.compile(r"`(asyncgrpo [^`]+)`")
OTHERS = re.compile(r"`(?:torchrun|python|pip) [^`]+`")  # another program's options
READS_A_CONFIG = ("launch", "consumer", "producer", "stress")
# Which commands show a module's messages (the first prefix that matches; others: any command).
SHOWN_BY = {
    "common/files/disk.py": ("launch", "consumer"),  # a run stopped by its disk: the consumer's top
    "common/": READS_A_CONFIG,  # config checks and sockets: wherever a config is read
    "launch/run_dir.py": ("launch", "consumer"),  # both claim a run directory
    "launch/cores.py": ("launch",),
    "launch/placement.py": ("stress",),
    "launch/stress/": ("stress",),
    "launch/cli/stress.py": ("stress",),
    "consumer/replay.py": ("replay",),  # the replaying learner: only `asyncgrpo replay`
    "consumer/evaluation/__init__.py": ("eval",),  # eval_target: what `asyncgrpo eval` scores
    "consumer/stream/": ("consumer", "replay"),
    "consumer/": ("consumer",),
    "producer/": ("producer",),
}


def commands() -> dict[str, Any]:
    """Every command of the CLI (typer's click commands) by its path (`config show`), groups
    left out."""
    out: dict[str, Any] = {}

    def walk(cmd: Any, path: str) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}".strip())
        else:
            out[path] = cmd

    walk(CLI, "")
    return out


def options_of(cmd: Any) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}


def strings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every string in a Python file but its docstrings; an f-string's
    replacement fields read as `X` (`f"--keys {d}"` is `--keys X`)."""
    tree = ast.parse(path.read_text())
    skipped = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skipped.add(id(body[0].value))
        if isinstance(node, ast.JoinedStr):
            skipped |= {id(v) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and id(node) not in skipped:
            parts = [v.value if isinstance(v, ast.Constant) else "X" for v in node.values]
            yield node.lineno, "".join(map(str, parts))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skipped
        ):
            yield node.lineno, node.value


def shown_by(relative: str) -> tuple[str, ...]:
    return next((cmds for prefix, cmds in SHOWN_BY.items() if relative.startswith(prefix)), ())


def hint_problems(relative: str, text: str) -> list[str]:
    """What is wrong with the hints of one string of module `relative` (a repository path)."""
    if OPTION.fullmatch(text.split("=")[0]):  # an option's declaration, or an argument
        return []
    out = [f"`{c}`: {p}" for c in QUOTED.findall(text) for p in command_problems(c, mention=True)]
    bare = OPTION.findall(OTHERS.sub("", QUOTED.sub("", text)))
    every = commands()
    for option in bare:
        where = shown_by(relative)
        have = [n for n in where if option in options_of(every[n])] if where else []
        if where and len(have) < len(where):
            missing = sorted(set(where) - set(have))
            out.append(f"{option}: not an option of {', '.join(missing)}")
        elif not where and not any(option in options_of(c) for c in every.values()):
            out.append(f"{option}: no command has it")
    return out


def product_hints() -> list[tuple[str, str]]:
    """(where, text) of every string of the product's code that names an option or a command."""
    out = []
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            for line, text in strings(path):
                if OPTION.search(text) or QUOTED.search(text):
                    out.append((f"{relative}:{line}", text))
    return out
