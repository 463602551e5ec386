"""A producer imports what its hf engine will need before registering (start-up in parallel)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_for_loads_the_model_types_modules_and_builds_nothing(tiny_model_dir: Path):
    model_type = json.loads((tiny_model_dir / "config.json").read_text())["model_type"]
    code = (
        "import sys, gc, torch\n"
        "from producer.engines.hf import import_for\n"
        f"name = 'transformers.models.{model_type}.modeling_{model_type}'\n"
        "assert name not in sys.modules\n"
        f"import_for(__import__('pathlib').Path({str(tiny_model_dir)!r}))\n"
        "assert name in sys.modules, name\n"
        "built = [o for o in gc.get_objects() if isinstance(o, torch.nn.Module)]\n"
        "assert not [m for m in built if any(True for _ in m.parameters())], built\n"
    )
    argv = [sys.executable, "-W", "ignore", "-c", code]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
