"""Our pipeline vs a single-process synchronous GRPO loop (and TRL), demo settings, one run.

    python bench/vs_loop.py [--seeds 0,1,2] [--steps 0] [--json PATH] [--keep DIR] [--no-trl]
        [--loop-threads 0]

For each seed, one after another on this machine, each started as its own command (the clock starts
when the command is started, so imports, model loading and start-up count): - loop:
bench/grpo_loop.py, one process: batched `generate` + this project's loss and trainer; - async:
`asyncgrpo launch` (launch/configs/demo.toml: max_staleness 2, two hf producers); - sync:
`asyncgrpo launch --max-staleness 0`; - trl:   bench/trl_grpo.py, TRL's GRPOTrainer with the same
settings, if `trl` is importable. All four read launch/configs/demo.toml (`--steps` overrides
run.steps) and evaluate the same held-out problems every `eval.learner_every_steps` steps, as the
learner does. The loop and TRL run with `--loop-threads` torch threads (default 1: on the 2-core
machine torch's default of 2 threads took 2.9 s per loop step instead of 0.15 s whenever other
processes shared the CPU; 0 = torch's default).

Per run, from its per-step records (the learner's metrics.jsonl; the loop's and TRL's JSON
lines), times in seconds:
- s_per_step: (end of the last step - end of the first) / (steps - 1), periodic evaluation
  included (the same evaluation in every run);
- first_step_s: command start -> end of the first optimizer step;
- t55_s: command start -> end of the first step whose periodic held-out evaluation reached
  `--threshold` (0.55); null if none did;
- final_acc: the last periodic evaluation; command_s: command start -> exit (`launch` also
  evaluates the start and final models on the whole held-out split and draws plots);
- cpu_s: CPU seconds (user + system) the command and every process it started used, start-up
  and evaluations included: the work, whatever else shares the machine.
- startup (async, sync; in `runs` only): command start -> the consumer listening, the first
  producer registered, the first producer holding weights (from the processes' logs);
- round_trip_s (async, sync): median over steps of the learner's `round_trip_s`, the previous
  optimizer step's end -> the step's first admitted group (for sync: publish, reload, lease,
  one generation, send); gen_s (loop): median of one generation, the step's first batched
  `generate` of all its groups, scored.

JSON keys (stable): for R in loop, async, sync, trl: R_s_per_step, R_first_step_s, R_t55_s,
R_final_acc, R_command_s, R_cpu_s, R_round_trip_s, R_gen_s (medians over seeds; a t55 that some
seeds never reached counts as infinite, and an infinite median is null); ratios
async_over_loop_step, sync_over_loop_step, trl_over_loop_step, async_over_loop_t55,
sync_over_loop_t55, trl_over_loop_t55 (< 1 = faster than the loop; null when a side is missing);
sync_round_trip_beyond_gen_ms (sync_round_trip_s - loop_gen_s in ms: what the synchronous round
trip costs beyond one generation); seeds, steps, threshold, cpus, trl_version (null without
trl), load_avg_1min_start / load_avg_1min_end, and runs: every run's figures.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("loop", "async", "sync", "trl")
FIGURES = (
    "s_per_step", "first_step_s", "t55_s", "final_acc", "command_s", "cpu_s", "round_trip_s",
    "gen_s",
)  # fmt: skip


def command(kind: str, seed: int, steps: int, work: Path, loop_threads: int) -> list[str]:
    """The command line of one run; its per-step records land in `records_path(...)`."""
    common = ["--seed", str(seed)] + (["--steps", str(steps)] if steps else [])
    if kind in ("loop", "trl"):
        script = ROOT / "bench" / ("grpo_loop.py" if kind == "loop" else "trl_grpo.py")
        threads = ["--threads", str(loop_threads)]
        return [sys.executable, str(script), "--out", str(work / "steps.jsonl"), *common, *threads]
    launch = [sys.executable, "-m", "launch.cli", "launch", "--run-dir", str(work), "--no-live"]
    launch += ["--set", f"run.seed={seed}"] + (["--steps", str(steps)] if steps else [])
    return launch + (["--max-staleness", "0"] if kind == "sync" else [])


def records_path(kind: str, work: Path) -> Path:
    return work / ("steps.jsonl" if kind in ("loop", "trl") else "metrics.jsonl")


def figures(
    records: list[dict[str, Any]], t0: float, t_end: float, threshold: float
) -> dict[str, Any]:
    """The run's figures (module docstring) from its per-step records."""
    steps = [r for r in records if "step" in r and "unix_time" in r]
    if not steps:
        raise RuntimeError("the run wrote no step records")
    evals = [r for r in steps if r.get("heldout_accuracy") is not None]
    hit = next((r for r in evals if r["heldout_accuracy"] >= threshold), None)
    span = steps[-1]["unix_time"] - steps[0]["unix_time"]
    trips = [r["round_trip_s"] for r in steps if r.get("round_trip_s") is not None]
    gens = [r["gen_s"] for r in steps if r.get("gen_s") is not None]
    return {
        "s_per_step": span / (len(steps) - 1) if len(steps) > 1 else None,
        "first_step_s": steps[0]["unix_time"] - t0,
        "t55_s": hit["unix_time"] - t0 if hit else None,
        "final_acc": evals[-1]["heldout_accuracy"] if evals else None,
        "command_s": t_end - t0,
        "round_trip_s": statistics.median(trips) if trips else None,
        "gen_s": statistics.median(gens) if gens else None,
        "steps": len(steps),
        "evaluations": [(r["step"], r["heldout_accuracy"]) for r in evals],
    }


_PHASES = (  # (figure, log file glob, text of the first line that marks it)
    ("consumer_listening_s", "consumer.log", " listening on "),
    ("producer_registered_s", "producer-*.log", "registered as "),
    ("producer_weights_s", "producer-*.log", "loaded weights v"),
)


def startup_phases(work: Path, t0: float) -> dict[str, float | None]:
    """Command start -> the first log line of each start-up phase of a `launch` run (seconds),
    from the processes' log timestamps (local time, millisecond resolution)."""
    out: dict[str, float | None] = {}
    for name, pattern, text in _PHASES:
        stamps = []
        for path in work.glob(pattern):
            for line in path.read_text(errors="replace").splitlines():
                if text in line:
                    stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
                    stamps.append(stamp + int(line[20:23]) / 1000)
                    break
        out[name] = min(stamps) - t0 if stamps else None
    return out


def run_one(kind: str, seed: int, a: argparse.Namespace, root: Path) -> dict[str, Any]:
    work = root / f"{kind}-seed{seed}"
    work.mkdir(parents=True)
    cmd = command(kind, seed, a.steps, work, a.loop_threads)
    load = os.getloadavg()[0]
    cpu0 = _children_cpu_s()
    t0 = time.time()
    with (root / f"{kind}-seed{seed}.log").open("w") as log:
        code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    t_end = time.time()
    cpu_s = _children_cpu_s() - cpu0
    if code != 0:
        tail = (root / f"{kind}-seed{seed}.log").read_text()[-2000:]
        raise RuntimeError(f"{kind} (seed {seed}) exited {code}: {' '.join(cmd)}\n{tail}")
    lines = records_path(kind, work).read_text().splitlines()
    out = figures([json.loads(x) for x in lines if x.strip()], t0, t_end, a.threshold)
    if kind in ("async", "sync"):
        out["startup"] = startup_phases(work, t0)
    return out | {"kind": kind, "seed": seed, "load_avg_1min": load, "cpu_s": cpu_s}


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of every finished child process, grandchildren included."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def median(values: list[float | None]) -> float | None:
    """Median with None as infinity; an infinite median is None."""
    m = statistics.median([math.inf if v is None else v for v in values])
    return None if math.isinf(m) else m


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for kind in RUNS:
        mine = [r for r in runs if r["kind"] == kind]
        for fig in FIGURES:
            res[f"{kind}_{fig}"] = median([r.get(fig) for r in mine]) if mine else None
    for kind in ("async", "sync", "trl"):
        for fig, key in (("s_per_step", "step"), ("t55_s", "t55")):
            ours, base = res[f"{kind}_{fig}"], res[f"loop_{fig}"]
            res[f"{kind}_over_loop_{key}"] = ours / base if ours and base else None
    trip, gen = res["sync_round_trip_s"], res["loop_gen_s"]
    res["sync_round_trip_beyond_gen_ms"] = (trip - gen) * 1000 if trip and gen else None
    return res


def table(res: dict[str, Any]) -> str:
    def cell(v: Any, fmt: str, unit: str = "") -> str:
        return "-".rjust(len(format(0.0, fmt)) + len(unit)) if v is None else format(v, fmt) + unit

    lines = ["run    s/step  vs loop  first step  to 55%  vs loop  final acc  command  CPU"]
    for kind in RUNS:
        if res.get(f"{kind}_s_per_step") is None and kind != "loop":
            continue
        step_ratio = 1.0 if kind == "loop" else res.get(f"{kind}_over_loop_step")
        t55_ratio = 1.0 if kind == "loop" else res.get(f"{kind}_over_loop_t55")
        lines.append(
            f"{kind:6} {cell(res[f'{kind}_s_per_step'], '6.3f')}  {cell(step_ratio, '6.2f', 'x')}"
            f"  {cell(res[f'{kind}_first_step_s'], '9.1f', 's')}"
            f" {cell(res[f'{kind}_t55_s'], '6.1f', 's')}  {cell(t55_ratio, '6.2f', 'x')}"
            f"  {cell(res[f'{kind}_final_acc'], '9.3f')}"
            f"  {cell(res[f'{kind}_command_s'], '6.1f', 's')}"
            f"  {cell(res[f'{kind}_cpu_s'], '6.1f', 's')}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0", help="comma-separated run seeds")
    ap.add_argument("--steps", type=int, default=0, help="run.steps (0 = the demo's)")
    ap.add_argument("--threshold", type=float, default=0.55, help="held-out accuracy to reach")
    ap.add_argument(
        "--loop-threads", type=int, default=1, help="torch threads of loop and TRL (0 = default)"
    )
    ap.add_argument("--no-trl", action="store_true", help="skip TRL even if it is installed")
    ap.add_argument("--keep", type=Path, help="keep run directories and logs here")
    ap.add_argument("--json", type=Path, help="write the results here")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    has_trl = importlib.util.find_spec("trl") is not None and not a.no_trl
    kinds = [k for k in RUNS if k != "trl" or has_trl]
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = a.keep or Path(tmp)
        runs = []
        for seed in seeds:
            for kind in kinds:
                runs.append(run_one(kind, seed, a, root))
                print(f"{kind} seed {seed}: {json.dumps(runs[-1])}", flush=True)
    res = summarise(runs) | {
        "seeds": seeds, "steps": a.steps or None, "threshold": a.threshold,
        "cpus": len(os.sched_getaffinity(0)), "loop_threads": a.loop_threads,
        "trl_version": importlib.metadata.version("trl") if has_trl else None,
        "load_avg_1min_start": load_start, "load_avg_1min_end": os.getloadavg()[0], "runs": runs,
    }  # fmt: skip
    print(table(res))
    if res["sync_round_trip_s"] is not None and res["loop_gen_s"] is not None:
        print(
            f"sync round trip (step end -> first admitted group): "
            f"{res['sync_round_trip_s'] * 1000:.1f} ms = one generation "
            f"({res['loop_gen_s'] * 1000:.1f} ms) + {res['sync_round_trip_beyond_gen_ms']:.1f} ms"
        )
    print(f"load average (1 min): {load_start:.2f} at start, {res['load_avg_1min_end']:.2f} at end")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
