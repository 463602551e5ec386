"""A two-setting staleness sweep on one GPU: the learner and a colocated vLLM producer.

    python bench/gpu_sweep.py --model DIR --out OUT [--steps 20] [--staleness 0,2] [--set k=v ...]
    python bench/gpu_sweep.py --model demo --out OUT --engine hf --device cpu   # try it on a CPU

Writes OUT/sweep.toml (the model on `--device` in bf16 on a GPU, the synthetic task, a snapshot
every step) and runs `asyncgrpo stress --engine vllm --max-staleness 0,2 --learner-gpus 0
--producer-gpus 0 --no-heldout` on it (one vLLM producer beside the learner with
`--colocated-memory` of the GPU), then reports from OUT/stress/results.csv, per setting:
steps/hour and the speedup over max_staleness = 0, the reward at equal steps and at the
synchronous setting's wall-clock, learner idle fraction, staleness, drops, placement. Writes
OUT/gpu_sweep.json. On a model with random weights every reward is 0 (zero-variance groups are
kept so that every step trains): the throughput columns are the measurement then, the reward
columns only show the plumbing.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REPORTED = (
    "setting", "status", "error", "placement", "steps", "wall_s", "run_wall_s", "steps_per_hour",
    "speedup_vs_sync", "learner_idle_frac", "tokens_per_s", "staleness_max_trained",
    "dropped_stale", "tis_weight_mean", "final_reward", "equal_time_s", "reward_at_equal_time",
)  # fmt: skip


def config_text(model: str, *, device: str, sets: list[str]) -> str:
    """The sweep's TOML: GPU-sized batches; `sets` (section.key=value, TOML values) last."""
    gpu = device != "cpu"
    values = {
        "model.path": json.dumps(model), "model.device": json.dumps(device),
        "model.dtype": '"bfloat16"' if gpu else '"float32"',
        "snapshot.dtype": '"bfloat16"' if gpu else '"float32"',
        "task.source": '"synthetic"', "staleness.publish_every": "1",
        "train.prompts_per_step": "16" if gpu else "4", "sampling.group_size": "8" if gpu else "4",
        "sampling.max_new_tokens": "256" if gpu else "5", "train.drop_zero_variance": "false",
        "eval.learner_every_steps": "0", "producer.max_in_flight": "64" if gpu else "2",
        "vllm.max_model_len": "1024",
    }  # fmt: skip
    if gpu:
        values["train.micro_batch_tokens"] = "8192"
    for s in sets:
        key, _, value = s.partition("=")
        values[key.strip()] = value.strip()
    sections: dict[str, list[str]] = {}
    for key, value in values.items():
        section, _, name = key.partition(".")
        sections.setdefault(section, []).append(f"{name} = {value}")
    return "".join(f"[{s}]\n" + "\n".join(lines) + "\n\n" for s, lines in sections.items())


def stress_args(out: Path, config: Path, *, engine: str, device: str, steps: int,
                staleness: str, colocated_memory: float) -> list[str]:  # fmt: skip
    args = [
        "stress", "--out", str(out), "--config", str(config), "--engine", engine,
        "--max-staleness", staleness, "--steps", str(steps), "--no-heldout",
    ]  # fmt: skip
    if device != "cpu":
        args += ["--learner-gpus", "0", "--producer-gpus", "0"]
        args += ["--colocated-memory", str(colocated_memory)]
    return args


def summarize(results_csv: Path) -> dict[str, Any]:
    """The reported columns of every setting, numbers as floats."""

    def value(v: str) -> Any:
        try:
            return float(v)
        except ValueError:
            return v

    with open(results_csv) as f:
        rows = list(csv.DictReader(f))
    return {r["setting"]: {k: value(r[k]) for k in REPORTED if k in r} for r in rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model directory ('demo': the embedded one)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--staleness", default="0,2")
    ap.add_argument("--engine", default="vllm", help="vllm; hf to try the script on a CPU")
    ap.add_argument("--device", default="cuda", help="the learner's device (cpu to try it)")
    ap.add_argument("--colocated-memory", type=float, default=0.3)
    ap.add_argument("--timeout", type=float, default=1500)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    config = a.out / "sweep.toml"
    config.write_text(config_text(a.model, device=a.device, sets=a.sets))
    args = stress_args(
        a.out / "stress", config, engine=a.engine, device=a.device, steps=a.steps,
        staleness=a.staleness, colocated_memory=a.colocated_memory,
    )  # fmt: skip
    t0 = time.perf_counter()
    with open(a.out / "stress.log", "wb") as log:
        code = subprocess.run(
            [sys.executable, "-m", "launch.cli", *args], cwd=ROOT, stdout=log,
            stderr=subprocess.STDOUT, timeout=a.timeout, check=False,
        ).returncode  # fmt: skip
    results = a.out / "stress" / "results.csv"
    settings = summarize(results) if results.exists() else {}
    res = {"exit_code": code, "sweep_wall_s": time.perf_counter() - t0, "settings": settings}
    (a.out / "gpu_sweep.json").write_text(json.dumps(res, indent=1))
    for name, row in settings.items():
        print(name, json.dumps(row))
    if code != 0:
        print((a.out / "stress.log").read_text(errors="replace")[-3000:])
    return code


if __name__ == "__main__":
    sys.exit(main())
