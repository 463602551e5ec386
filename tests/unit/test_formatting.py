"""The formatter has the last word in product code (common, consumer, producer, launch): few
`# fmt: skip` (each with its reason), no file over 500 lines as `ruff format` lays it out, and
messages and records built with keywords wherever a call passes more than three fields."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("common", "consumer", "producer", "launch")
MAX_SKIPS, MAX_LINES = 10, 500
RECORD_MODULES = (  # the typed boundaries: wire messages and run-dir records
    "common.wire.messages",
    "common.wire.fetch",
    "common.wire.spec",
    "common.files.run_files",
    "common.files.metrics",
    "common.files.net_stats",
    "common.files.completions_file",
)


def product_files() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py"))


def test_few_formatter_exemptions_each_with_its_reason():
    skips = [
        (str(p.relative_to(ROOT)), n, line)
        for p in product_files()
        for n, line in enumerate(p.read_text().splitlines(), start=1)
        if re.search(r"#\s*fmt:\s*(skip|off)", line)
    ]
    assert len(skips) <= MAX_SKIPS, skips
    unexplained = [s for s in skips if not re.search(r"fmt:\s*(skip|off)\s*\S", s[2])]
    assert not unexplained, f"say why the formatter is off: {unexplained}"


def test_no_product_file_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in product_files()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert not long, f"cut these at a seam: {long}"


def record_fields() -> dict[str, int]:
    """Each message and record class by name."""
    out = {}
    for name in RECORD_MODULES:
        module = importlib.import_module(name)
        for cls_name, cls in vars(module).items():
            if inspect.isclass(cls) and dataclasses.is_dataclass(cls) and cls.__module__ == name:
                out[cls_name] = len(dataclasses.fields(cls))
    return out


def test_messages_and_records_are_built_with_keywords_beyond_three_fields():
    records = record_fields()
    assert {"Group", "LeaseRequest", "FetchPlan", "StepRecord", "Balance"} <= set(records)
    positional = []
    for path in product_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in records and len(node.args) > 3:
                positional.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not positional, positional
