"""Each attribute of the network thread's `NetState` is written in one module, the one
`WRITTEN_BY` names (consumer/server/state.py's docstring says why each): found by reading every
consumer module for assignments to it, to its entries, and calls that change a container."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from consumer.server.state import WRITTEN_BY

ROOT = Path(__file__).resolve().parents[2]
MUTATORS = {"pop", "popitem", "clear", "update", "setdefault", "add", "discard", "append",
            "extend", "remove", "insert"}  # fmt: skip
STATE = "consumer/server/state.py"
HOLDERS = {"st", "state", "net"}  # the names the network thread's parts give their NetState


def holds_state(node: ast.expr, *, in_state_module: bool) -> bool:
    """`node` is a NetState: `st`, `state`, `self._state`, or `self` inside state.py."""
    if isinstance(node, ast.Name):
        return node.id in HOLDERS or (in_state_module and node.id == "self")
    return isinstance(node, ast.Attribute) and node.attr in ("_state", "state")


def written(tree: ast.AST, *, in_state_module: bool) -> Iterator[tuple[str, int]]:
    """(attribute, line) of every write to a NetState attribute in `tree`."""

    def attribute(target: ast.expr) -> str | None:
        while isinstance(target, ast.Subscript):
            target = target.value
        if isinstance(target, ast.Attribute) and holds_state(
            target.value, in_state_module=in_state_module
        ):
            return target.attr
        return None

    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [
                t
                for tgt in node.targets
                for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])
            ]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
        ):
            targets = [node.func.value]
        for target in targets:
            name = attribute(target)
            if name in WRITTEN_BY:
                yield name, node.lineno


def constructor(tree: ast.AST) -> ast.FunctionDef:
    return next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef) and n.name == "NetState"
        for n in n.body
        if isinstance(n, ast.FunctionDef) and n.name == "__init__"
    )


def test_every_net_state_attribute_is_written_by_the_one_module_named():
    """Its constructor declares every attribute; after that only `WRITTEN_BY`'s module writes
    it (an attribute bound once, such as the lease book, is state.py's)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "consumer").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        skip: set[int] = set()
        if where == STATE:
            init = constructor(tree)
            skip = set(range(init.lineno, (init.end_lineno or init.lineno) + 1))
        for name, line in written(tree, in_state_module=where == STATE):
            if line not in skip:
                found.setdefault(name, set()).add(where)
    wrong = {a: sorted(m) for a, m in found.items() if m != {WRITTEN_BY[a]}}
    assert not wrong, f"NetState attributes written outside their module (WRITTEN_BY): {wrong}"
    unwritten = {a for a in WRITTEN_BY if a not in found and WRITTEN_BY[a] != STATE}
    assert not unwritten  # named for another module, which never writes it


def test_written_by_names_every_attribute_the_constructor_declares():
    init = constructor(ast.parse((ROOT / STATE).read_text()))
    declared = {
        t.attr
        for n in ast.walk(init)
        if isinstance(n, ast.Assign | ast.AnnAssign)
        for tgt in (n.targets if isinstance(n, ast.Assign) else [n.target])
        for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])
        if isinstance(t, ast.Attribute)
    }
    assert declared == set(WRITTEN_BY)


def test_the_checker_finds_writes_of_each_kind():
    source = (
        "st.granting = True\n"
        "st.counters['x'] += 1\n"
        "del st.producers['p']\n"
        "self._state.routes.pop('p')\n"
        "st.hosts['p'] = 'h'\n"
        "a, st.roster_changes = st.roster_changes, {}\n"
        "st.book.grant()\n"  # the book's own method: not a write to NetState
    )
    got = sorted(name for name, _ in written(ast.parse(source), in_state_module=False))
    assert got == ["counters", "granting", "hosts", "producers", "roster_changes", "routes"]
