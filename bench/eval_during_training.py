"""What evaluation during training through the producers costs on the demo: the time from the
command to a held-out score of 55%, with eval every 20 steps, against the same run without eval.

    python bench/eval_during_training.py [--seeds 0,1] [--steps 300] [--every 20]
        [--prompts 64] [--target 0.55] [--json PATH]

For each seed, one after another on this machine, alternating (off, on):
- off: `asyncgrpo launch --no-eval --no-live` (launch/configs/demo.toml) with no evaluation
  during training at all (`eval.learner_every_steps=0`, `eval.every_steps=0`);
- on:  the same with `eval.every_steps=EVERY` and greedy completions (`eval.temperature=0`) of
  the first PROMPTS held-out prompts (`eval.max_prompts`, default 64 as in the config).
From each run's metrics.jsonl: s_per_step = (end of the last step - end of the first) /
(steps - 1), the learner's pace. From the `on` run: the first version V whose evaluation
reached the target (`eval_pass_at_1` >= TARGET) and on_s_to_target, the seconds from the
command's start to the metrics line that reported it; from the `off` run at the same seed:
off_s_to_version, the seconds from its command's start to the end of step V (when it held the
same weights, with nothing evaluated). on_over_off_to_target = on_s_to_target /
off_s_to_version (None when a run never reached the target).

JSON keys (stable): on_over_off_to_target, on_over_off_s_per_step (medians over seeds that
reached it / all seeds), off_s_per_step, on_s_per_step, seeds, steps, every, prompts, target,
cpus, load_avg_1min_start, load_avg_1min_end, runs (every run's figures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if TYPE_CHECKING:
    from common.files.metrics import StepRecord


def _launch(
    out: Path, seed: int, steps: int, every: int, prompts: int
) -> tuple[float, list[StepRecord]]:
    """Run the demo; (its command's start as unix time, its metrics lines)."""
    from common.files.metrics import read_steps

    cmd = [sys.executable, "-m", "launch.cli", "launch", "--no-eval", "--no-live",
           "--run-dir", str(out), "--steps", str(steps), "--set", f"run.seed={seed}",
           "--set", "eval.learner_every_steps=0", "--set", f"eval.every_steps={every}"]  # fmt: skip
    if every:
        cmd += ["--set", "eval.temperature=0", "--set", f"eval.max_prompts={prompts}"]
    start = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    return start, read_steps(out / "metrics.jsonl")


def _pace(recs: list[StepRecord]) -> float:
    return float((recs[-1].time_s - recs[0].time_s) / (len(recs) - 1))


def figures(
    off: list[StepRecord], off_start: float, on: list[StepRecord], on_start: float, target: float
) -> dict[str, Any]:
    """One seed's figures (module docstring) from its two runs' metrics lines and starts."""
    hit = next((r for r in on if (r.eval_pass_at_1 or 0.0) >= target), None)
    row: dict[str, Any] = {
        "off_s_per_step": _pace(off), "on_s_per_step": _pace(on),
        "evaluated": [(r.eval_version, r.eval_pass_at_1) for r in on if r.eval_version is not None],
        "rounds_skipped": on[-1].eval_rounds_skipped, "version_at_target": None,
        "on_s_to_target": None, "off_s_to_version": None, "on_over_off_to_target": None,
    }  # fmt: skip
    if hit is not None:
        version = hit.eval_version or 0
        same = next(r for r in off if r.step == max(version, 1))
        row["version_at_target"] = version
        row["on_s_to_target"] = hit.unix_time - on_start
        row["off_s_to_version"] = same.unix_time - off_start
        row["on_over_off_to_target"] = row["on_s_to_target"] / row["off_s_to_version"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--target", type=float, default=0.55)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    load_start = os.getloadavg()[0]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            off_start, off = _launch(Path(tmp) / f"off-{seed}", seed, args.steps, 0, 0)
            on_start, on = _launch(
                Path(tmp) / f"on-{seed}", seed, args.steps, args.every, args.prompts
            )
            row = {"seed": seed, **figures(off, off_start, on, on_start, args.target)}
            runs.append(row)
            print(json.dumps(row), flush=True)
    reached = [r["on_over_off_to_target"] for r in runs if r["on_over_off_to_target"] is not None]
    off_pace = statistics.median(r["off_s_per_step"] for r in runs)
    on_pace = statistics.median(r["on_s_per_step"] for r in runs)
    out = {
        "on_over_off_to_target": statistics.median(reached) if reached else None,
        "on_over_off_s_per_step": on_pace / off_pace, "off_s_per_step": off_pace,
        "on_s_per_step": on_pace, "seeds": seeds, "steps": args.steps, "every": args.every,
        "prompts": args.prompts, "target": args.target, "cpus": os.cpu_count(),
        "load_avg_1min_start": load_start, "load_avg_1min_end": os.getloadavg()[0], "runs": runs,
    }  # fmt: skip
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
