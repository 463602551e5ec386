"""No import cycle in product code (common, producer, consumer, launch): a pluggable part is a
base module, its implementations and a lazy factory in the package's `__init__`, never a factory
in the base that the implementations import back (STYLE.md).

grimp (installed with import-linter) builds the graph of every import, those inside functions
and under `TYPE_CHECKING` included; a cycle is a strongly connected component of more than one
module (Tarjan's algorithm), named module by module with the line of each import."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import grimp
import pytest

PRODUCT = ("common", "producer", "consumer", "launch")


def strongly_connected(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node of the graph `edges` (node ->
    the nodes it points to), each sorted, in sorted order (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(edges.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def a_cycle(component: list[str], edges: Mapping[str, Iterable[str]]) -> list[str]:
    """One cycle through the first module of `component`: [m0, m1, ..., m0] (breadth-first, so
    the shortest)."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(edges.get(node, ())):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if target in members and target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"{component} is not strongly connected")


def import_cycles(packages: Iterable[str]) -> list[str]:
    """Every import cycle among the modules of `packages`, one line each:
    `a -> b (a.py:12) -> a (b.py:3)`."""
    graph = grimp.build_graph(*packages, cache_dir=None)
    edges = {m: graph.find_modules_directly_imported_by(m) - {m} for m in graph.modules}
    lines = []
    for component in strongly_connected(edges):
        cycle = a_cycle(component, edges)
        steps = [cycle[0]]
        for importer, imported in itertools.pairwise(cycle):
            details = graph.get_import_details(importer=importer, imported=imported)
            where = ", ".join(f"line {d['line_number']}" for d in details[:2])
            steps.append(f"{imported} ({importer}: {where})")
        lines.append(" -> ".join(steps) + f"  [{len(component)} modules in the cycle's component]")
    return lines


def test_the_detector_finds_every_cycle_and_nothing_else():
    edges = {
        "a": ["b"], "b": ["c"], "c": ["a", "d"], "d": ["e"], "e": ["d"], "f": ["a"], "g": [],
    }  # fmt: skip
    assert strongly_connected(edges) == [["a", "b", "c"], ["d", "e"]]
    assert a_cycle(["a", "b", "c"], edges) == ["a", "b", "c", "a"]
    assert strongly_connected({"a": ["b"], "b": ["c"], "c": []}) == []  # a chain is no cycle
    deep = {f"m{i:04d}": [f"m{i + 1:04d}"] for i in range(5000)} | {"m5000": ["m0000"]}
    assert [len(c) for c in strongly_connected(deep)] == [5001]  # no recursion limit


def _package(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def importable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[Mapping[str, str]], None]]:
    """Write a package under tmp_path, importable by grimp (and forgotten after the test)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(files: Mapping[str, str]) -> None:
        _package(tmp_path, files)

    yield write
    for name in [m for m in sys.modules if m.split(".")[0] in ("cyclic", "acyclic")]:
        del sys.modules[name]


def test_a_factory_that_its_engines_import_back_is_named_as_a_cycle(importable):
    """The shape this project once had: producer/engine.py (the factory) <-> engine_hf.py."""
    importable({
        "cyclic/__init__.py": "",
        "cyclic/engine.py": "def make():\n    from cyclic import engine_hf\n",
        "cyclic/engine_hf.py": "from cyclic.engine import make\n",
        "cyclic/base.py": "",
    })  # fmt: skip
    (line,) = import_cycles(["cyclic"])
    assert line.startswith("cyclic.engine -> cyclic.engine_hf (cyclic.engine: line 2) -> ")
    assert "cyclic.engine (cyclic.engine_hf: line 1)" in line


def test_a_lazy_factory_in_the_package_init_is_no_cycle(importable):
    importable({
        "acyclic/__init__.py": "",
        "acyclic/engines/__init__.py": "def make():\n    from acyclic.engines import hf\n",
        "acyclic/engines/base.py": "",
        "acyclic/engines/hf.py": "from acyclic.engines.base import *\n",
    })  # fmt: skip
    assert import_cycles(["acyclic"]) == []


def test_product_code_has_no_import_cycle():
    cycles = import_cycles(PRODUCT)
    assert not cycles, "import cycles in product code:\n" + "\n".join(cycles)
