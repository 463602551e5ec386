"""The loss variants' wall cost per learner step: `Trainer.step` with each variant vs the default.

    python bench/loss_variants.py                         # CPU, demo model, 8 x 8 rows
    python bench/loss_variants.py --lengths mix --updates 2 --json out.json

One trainer per variant (`launch/stress/plan.py` VARIANTS: the settings `asyncgrpo stress
--variant` sweeps; "grpo" is the default loss), each built from the same demo model and seed,
stepping on the same batch (bench/learner_step.py's groups; `--lengths mix` gives completions of
unequal length, so the overlong punishment and the per-row means have work to do). Steps
alternate over the variants, round after round after `--warmup` rounds, so a change of load
hits all alike; medians are reported. `--updates 2` (train.updates_per_batch) adds the
old-log-prob pass and moves the ratios off 1, where the objectives clip.

Printed and written (`--json PATH`) per variant: `ms` (median ms per step), and `ratio`, its
median ms over grpo's (the figure docs/results.md quotes); `max_ratio` is the largest of them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from learner_step import SHAPES, groups

from common import config as C
from consumer.train import make_trainer
from launch.stress.plan import VARIANTS, variant_overrides

BASELINE = "grpo"


def run(a: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    base = C.override(
        C.Config(),
        {
            "model.device": "cpu",
            "model.path": str(model_dir),
            "sampling.max_new_tokens": 40 if a.lengths == "mix" else 5,
            "train.updates_per_batch": a.updates,
        },
    )
    names = [v for v in VARIANTS if v != "config"]
    trainers = {}
    for name in names:
        torch.manual_seed(a.seed)
        trainers[name] = make_trainer(C.override(base, variant_overrides(name, base)), model_dir)
    shape = SHAPES["demo"]
    batch = groups(
        shape["groups"],
        8,
        trainers[BASELINE].vocab_size,
        lengths=a.lengths,
        prompt_tokens=shape["prompt_tokens"],
        tokens=shape["tokens"],
        mix=shape["mix"],
        seed=a.seed,
    )
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(a.warmup + a.repeats):
        for name in names:
            t0 = time.perf_counter()
            trainers[name].step(batch)
            if r >= a.warmup:
                times[name].append(time.perf_counter() - t0)
    ms = {name: 1000 * statistics.median(t) for name, t in times.items()}
    out = {name: {"ms": ms[name], "ratio": ms[name] / ms[BASELINE]} for name in names}
    return {
        "lengths": a.lengths,
        "updates_per_batch": a.updates,
        "repeats": a.repeats,
        "variants": out,
        "max_ratio": max(v["ratio"] for v in out.values()),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="equal", choices=["equal", "mix"])
    ap.add_argument("--updates", type=int, default=1, help="train.updates_per_batch")
    ap.add_argument("--repeats", type=int, default=60, help="timed steps of each variant")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="", help="model directory (default: the demo model)")
    ap.add_argument("--json", default="", help="write the results here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.model:
        model_dir = Path(a.model)
    else:
        from launch.demo_model import ensure_demo_model

        model_dir = ensure_demo_model()
    res = run(a, model_dir)
    print(f"demo model, {a.lengths} lengths, updates_per_batch {a.updates}, {a.repeats} steps each")
    for name, v in res["variants"].items():
        print(f"  {name:12s} {v['ms']:7.2f} ms/step  {v['ratio']:.3f}x {BASELINE}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
