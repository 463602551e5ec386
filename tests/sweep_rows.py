"""Rows of finished sweep settings, as launch/stress/run.py keeps them in result.json, and a
sweep's directory holding them (tests of the sweep's report and verdict)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common import config as C
from launch.stress.plan import Setting, Sweep
from launch.stress.run import check_resume, write_outputs


def row(ms: int, seed: int, steps_per_hour: float, **extra: Any) -> dict[str, Any]:
    """A finished setting's row (2 producers, IS off, 8 steps)."""
    setting = Setting(ms, 2, "off", seed)
    return {
        "setting": setting.name, "max_staleness": ms, "producers": 2, "is_mode": "off",
        "seed": seed, "status": "ok", "error": "", "wall_s": 3600 * 8 / steps_per_hour,
        "steps_per_hour": steps_per_hour, "learner_idle_frac": 0.2, "final_reward": 0.5,
        "reward_at_equal_time": 0.5, "staleness_hist": json.dumps({"0": 8}),
        "_curve": [(1.0, 0.4), (2.0, 0.5)], **extra,
    }  # fmt: skip


def sweep_dir(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    """A sweep's directory holding `rows`, its outputs written as the sweep writes them."""
    out = tmp_path / "sweep"
    check_resume(out, C.Config(), Sweep(engine="fake", steps=8), resume=False)
    for r in rows:
        (out / "runs" / r["setting"]).mkdir(parents=True)
        (out / "runs" / r["setting"] / "result.json").write_text(json.dumps(r))
    write_outputs(out, rows, [])
    return out
