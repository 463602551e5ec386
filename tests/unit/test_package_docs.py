"""Each package's docstring lists its rooms: every module and subpackage directly in it is named
there (`name.py`, `name/`, or `name` in backquotes), so a reader finds a file from its package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("common", "consumer", "producer", "launch")


def unnamed(package: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    rooms = [p.stem for p in package.glob("*.py") if not p.name.startswith("__")]
    rooms += [p.name for p in package.iterdir() if (p / "__init__.py").exists()]
    return sorted(r for r in rooms if not re.search(rf"(?<!\w){r}(\.py|/|`)|`{r}`", doc))


def test_every_package_docstring_names_its_rooms():
    packages = sorted(p.parent for top in PRODUCT for p in (ROOT / top).rglob("__init__.py"))
    assert len(packages) >= 20
    missing = {str(p.relative_to(ROOT)): m for p in packages if (m := unnamed(p))}
    assert not missing, f"name these in their package's docstring: {missing}"
