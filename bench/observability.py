"""What the trackers and completions samples cost the learner: the demo with and without them.

    python bench/observability.py [--seeds 0,1] [--steps 300] [--report-to tensorboard,wandb]
        [--completions-every 1] [--json PATH]

For each seed, one after another on this machine, alternating (off, on):
- off: `asyncgrpo launch --no-eval --no-live` (launch/configs/demo.toml), trackers off,
  completions samples off (`log.completions_every=0`);
- on:  the same with `--report-to` the trackers named (default both; W&B with
  WANDB_MODE=offline) and a completions sample every `--completions-every` steps (default 1:
  ten times the default rate, the worst case).
From each run's metrics.jsonl, in seconds: s_per_step = (end of the last step - end of the
first) / (steps - 1) (the learner's pace, waiting for groups included); step_s = the median
optimizer step (the training thread's own work); wall_s = the whole command, start-up and
shutdown included (a tracker's start-up shows here when it is not in s_per_step). Also,
measured in this process: submit_us, the training thread's cost of handing one step's record
and one completions sample of two groups to the logger thread (median over 500 of each, µs).

JSON keys (stable): off_s_per_step, on_s_per_step, on_over_off_s_per_step, off_step_s,
on_step_s, on_over_off_step_s, off_wall_s, on_wall_s, on_over_off_wall_s (medians over seeds,
and their ratio); paired_on_over_off_s_per_step, paired_on_over_off_step_s,
paired_on_over_off_wall_s (the median over seeds of each seed's on/off ratio: a seed's pace
varies with its draws by more than the trackers cost, so the pairs are the steadier figure)
and their `_per_seed` lists; submit_us, seeds, steps, cpus, load_avg_1min_start,
load_avg_1min_end, runs (every run's figures).
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# one metrics line of the demo's size (the hand-off's cost grows with its fields)
RECORD: dict[str, Any] = {
    "step": 3, "time_s": 1.5, "unix_time": 1.7e9, "step_wall_s": 0.5, "reward_mean": 0.25,
    "reward_std": 0.4, "reward_mean_seen": 0.3, "frac_reward_zero_std": 0.4,
    "reward_fn_means": {"exact_match": 0.3}, "staleness_mean": 0.5, "staleness_max": 1,
    "staleness_hist": {"0": 2, "1": 2}, "tokens_per_s": 100.0, "learner_idle_frac": 0.2,
    "wait_s": 0.1, "publish_submit_s": 0.01, "snapshot_write_s": 0.02, "snapshots_superseded": 0,
    "num_completion_tokens": 50, "groups_trained": 12, "groups_dropped_stale": 1,
    "groups_dropped_zero_variance": 2, "groups_rejected_invalid": 0, "groups_expired": 0,
    "leases_open": 4, "rejected_messages": 0, "step_s": 0.2, "grad_norm": 1.0, "lr": 1e-5,
}  # fmt: skip


def _launch(
    out: Path, seed: int, steps: int, on: bool, report_to: str, every: int
) -> dict[str, float]:
    from common.files.metrics import read_steps

    cmd = [sys.executable, "-m", "launch.cli", "launch", "--no-eval", "--no-live",
           "--run-dir", str(out), "--steps", str(steps), "--set", f"run.seed={seed}"]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    if on:
        cmd += ["--set", f"log.completions_every={every}"]
        cmd += ["--report-to", report_to] if report_to else []
    else:
        cmd += ["--set", "log.completions_every=0"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, capture_output=True)
    wall = time.perf_counter() - t0
    recs = read_steps(out / "metrics.jsonl")
    if on and report_to and recs[-1].loggers_failed:  # it would measure no tracker at all
        log = (out / "consumer.log").read_text()
        raise SystemExit(f"a tracker failed in {out}: " + log[log.find("logger ") :][:300])
    pace = (recs[-1].time_s - recs[0].time_s) / (len(recs) - 1)
    step_s = statistics.median(r.step_s for r in recs if r.step_s is not None)
    return {"s_per_step": pace, "step_s": step_s, "wall_s": wall, "steps": len(recs)}


def _submit_us() -> float:
    """The training thread's cost of one step's hand-off (record + completions sample)."""
    import numpy as np

    from common import config as C
    from common import wire
    from common.files import metrics as M
    from consumer.loggers import thread as T

    class Idle:  # a tracker that takes no time: this measures the hand-off alone
        name = "idle"

        def __getattr__(self, _name: str):  # type: ignore[no-untyped-def]
            return lambda *args: None

    T.Loggers._open_sinks = lambda self: [Idle()]  # type: ignore[method-assign]
    cfg = C.apply_overrides(C.Config(), ['log.report_to=["tensorboard"]'])
    with tempfile.TemporaryDirectory() as tmp:
        loggers = T.Loggers(cfg, Path(tmp), None)
        loggers.start()
        record = M.StepRecord(**RECORD)
        g = wire.Group(
            lease_id=1, producer_id="p", prompt_index=0, behavior_version=0,
            prompt_ids=np.arange(8, dtype=np.int32), completion_ids=np.arange(64, dtype=np.int32),
            completion_lens=np.full(8, 8, np.int32), behavior_logp=np.full(64, -1.0, np.float32),
            token_versions=np.zeros(0, np.int32), rewards=np.zeros(8, np.float32),
            finish_reasons=("stop",) * 8, temperature=1.0,
        )  # fmt: skip
        times = []
        for _ in range(500):
            t0 = time.perf_counter()
            loggers.submit_step(record)
            loggers.submit_completions(1, [g, g])
            times.append(time.perf_counter() - t0)
        loggers.close()
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=300)  # the demo's own
    ap.add_argument("--report-to", default="tensorboard,wandb")
    ap.add_argument("--completions-every", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    load_start = os.getloadavg()[0]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for on in (False, True):
                out_dir = Path(tmp) / f"{'on' if on else 'off'}-{seed}"
                fig = _launch(out_dir, seed, args.steps, on, args.report_to, args.completions_every)
                runs.append({"seed": seed, "on": on, **fig})
                print(json.dumps(runs[-1]), flush=True)
    out: dict[str, object] = {}
    for key in ("s_per_step", "step_s", "wall_s"):
        off = statistics.median(r[key] for r in runs if not r["on"])
        on_ = statistics.median(r[key] for r in runs if r["on"])
        out |= {f"off_{key}": off, f"on_{key}": on_, f"on_over_off_{key}": on_ / off}
        pairs = [on_r[key] / off_r[key] for off_r, on_r in zip(runs[::2], runs[1::2], strict=True)]
        out |= {f"paired_on_over_off_{key}": statistics.median(pairs),
                f"paired_on_over_off_{key}_per_seed": pairs}  # fmt: skip
    out |= {
        "submit_us": _submit_us(), "seeds": seeds, "steps": args.steps, "cpus": os.cpu_count(),
        "report_to": args.report_to, "completions_every": args.completions_every,
        "load_avg_1min_start": load_start, "load_avg_1min_end": os.getloadavg()[0], "runs": runs,
    }  # fmt: skip
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
