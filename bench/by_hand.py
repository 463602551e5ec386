"""A consumer and a producer started by hand on one host against the same run by `launch`.

    PYTHONPATH=. python bench/by_hand.py [--steps 100] [--seeds 0,1,2] [--json PATH]
        [--config launch/configs/demo.toml] [--tree DIR]

Each seed, one after another: `asyncgrpo launch --no-live --no-eval` (the cores rule, the core
board), then the same config through `asyncgrpo consumer --run-dir D` and `asyncgrpo producer
--connect-file D/endpoints.json`, started as a user types them (no thread settings: their
defaults; the producer told the leases `launch` gives it, `producer.max_in_flight`, the one
setting launch adds). Figures from each run's metrics.jsonl: the learner's step (`step_s`,
median over steps 3..N) and s/step ((end of step N - end of step 3) / (N - 3)). `--tree DIR`
runs the commands of another checkout (its own code, on PYTHONPATH), e.g. the code before a
change, to compare.

JSON keys (stable): launch_step_s, hand_step_s, hand_over_launch_step, launch_s_per_step,
hand_s_per_step, hand_over_launch_s_per_step (medians over seeds), seeds, steps,
load_avg_1min_start, load_avg_1min_end, runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "launch" / "configs" / "demo.toml"


def figures(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    steady = rows[2:]
    span = steady[-1]["unix_time"] - steady[0]["unix_time"]
    return {
        "step_s": statistics.median(r["step_s"] for r in steady),
        "s_per_step": span / max(len(steady) - 1, 1),
    }


TREE = ROOT  # whose code runs the commands (--tree)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "launch.cli", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(TREE)}


def launch(cfg: Path, seed: int, steps: int, run_dir: Path, log: Path) -> None:
    args = cli("launch", "--config", str(cfg), "--run-dir", str(run_dir), "--steps", str(steps))
    args += ["--no-live", "--no-eval", "--set", f"run.seed={seed}"]
    with log.open("w") as out:
        subprocess.run(args, cwd=TREE, env=env(), stdout=out, stderr=subprocess.STDOUT, check=True)


def by_hand(cfg: Path, seed: int, steps: int, run_dir: Path, log: Path, leases: int) -> None:
    consumer = cli("consumer", "--config", str(cfg), "--run-dir", str(run_dir))
    consumer += ["--steps", str(steps), "--set", f"run.seed={seed}"]
    producer = cli("producer", "--connect-file", str(run_dir / "endpoints.json"))
    producer += ["--set", f"producer.max_in_flight={leases}"]
    with log.open("w") as out:
        procs = [
            subprocess.Popen(c, cwd=TREE, env=env(), stdout=out, stderr=subprocess.STDOUT)
            for c in (consumer, producer)
        ]
        codes = [p.wait(timeout=3600) for p in procs]
    if codes[0] != 0:
        raise RuntimeError(f"the consumer exited {codes[0]}: {log}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=DEMO)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose commands run")
    a = ap.parse_args()
    global TREE
    TREE = a.tree.resolve()
    from common import config as C
    from launch import cores

    cfg = C.load(a.config)
    rule = cores.plan(
        cores.usable_cores(),
        max_staleness=cfg.staleness.max_staleness,
        prompts_per_step=cfg.train.prompts_per_step,
    )
    load_start = os.getloadavg()[0]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in a.seeds.split(",")):
            for kind in ("launch", "hand"):
                run_dir, log = Path(tmp) / f"{kind}-{seed}", Path(tmp) / f"{kind}-{seed}.log"
                if kind == "launch":
                    launch(a.config, seed, a.steps, run_dir, log)
                else:
                    by_hand(a.config, seed, a.steps, run_dir, log, rule.max_in_flight)
                runs.append({"kind": kind, "seed": seed, **figures(run_dir)})
                print(json.dumps(runs[-1]), flush=True)
    res: dict[str, Any] = {}
    for kind in ("launch", "hand"):
        for fig in ("step_s", "s_per_step"):
            res[f"{kind}_{fig}"] = statistics.median(r[fig] for r in runs if r["kind"] == kind)
    res["hand_over_launch_step"] = res["hand_step_s"] / res["launch_step_s"]
    res["hand_over_launch_s_per_step"] = res["hand_s_per_step"] / res["launch_s_per_step"]
    res |= {"seeds": a.seeds, "steps": a.steps, "load_avg_1min_start": load_start}
    res |= {"load_avg_1min_end": os.getloadavg()[0], "runs": runs}
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
