"""bench/loss_variants.py: a short real run of every variant's step, with the stable JSON keys."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_variant_is_timed_against_grpo(tiny_model_dir: Path, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "loss_variants", ROOT / "bench" / "loss_variants.py"
    )
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "lv.json"
    args = ["--model", str(tiny_model_dir), "--repeats", "2", "--warmup", "0", "--lengths", "mix"]
    bench.main([*args, "--updates", "2", "--json", str(out)])
    res = json.loads(out.read_text())
    assert set(res["variants"]) == {
        "grpo",
        "gspo",
        "gmpo",
        "cispo",
        "rloo",
        "reinforce++",
        "dapo",
    }
    assert res["variants"]["grpo"]["ratio"] == 1.0
    assert all(v["ms"] > 0 for v in res["variants"].values())
    assert res["max_ratio"] == max(v["ratio"] for v in res["variants"].values())
    assert res["updates_per_batch"] == 2
