"""One GPU, two processes: the learner (bf16) and a vLLM producer, through the real CLI.

    python bench/gpu_pipeline.py --model DIR --out OUT [--steps 30] [--label name] [--set k=v ...]
    python bench/gpu_pipeline.py --model DIR --out OUT --engine hf --device cpu   # try it on a CPU

Starts `asyncgrpo consumer` (model on cuda, bf16 autocast) and `asyncgrpo producer --engine
vllm` (vLLM with `vllm.gpu_memory_utilization` of the GPU) as separate processes over loopback
ZeroMQ, waits for `--steps` optimizer steps and reports, from the run's own files:
- learner idle fraction (time waiting for groups / wall) and completion tokens/s trained;
- staleness of trained groups, TIS weight mean, mean |learner - behaviour| log-prob;
- publication: the training thread's block per publish (`publish_submit_s`), the writer's time
  per snapshot (`snapshot_write_s`), versions superseded by a newer one before they were written;
- wall time per step over the learner's own step time (`wall_over_step`, 1.0 = publication and
  waiting for groups cost nothing);
- reload delay: learner step done (metrics `unix_time` less `publish_submit_s`) → the producer
  logged the new version loaded (its `loaded weights vN` line: generating on it), median and max;
  and from the producer's counters how it got the snapshots (`snapshots_local_trusted`: the
  writer's hash taken on this host; `snapshots_local`: hashed; `snapshots_fetched`: over
  control) with the seconds spent fetching and reloading;
- the ledger balance.
Writes OUT/<label>.json and the run directory OUT/<label>-run/ (logs included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_RELOAD_KEYS = ("reloads", "reload_s", "fetch_s")
sys.path.insert(0, str(ROOT))
from common.files import run_files as RF  # noqa: E402 (the repository, not an installed copy)
from common.files.metrics import read_steps  # noqa: E402


def cli(*args: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "launch.cli", *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def loaded_times(log: Path) -> dict[int, float]:
    """version -> unix time of the producer's 'loaded weights vN' line."""
    out = {}
    for line in log.read_text(errors="replace").splitlines():
        if "loaded weights v" in line:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out[int(line.rsplit("v", 1)[1])] = stamp
    return out


def run(
    model: Path,
    out: Path,
    *,
    steps: int,
    label: str,
    sets: list[str],
    timeout_s: float,
    engine: str,
    device: str = "cuda",
) -> dict[str, Any]:
    run_dir = out / f"{label}-run"
    base = [
        f"model.path={model}", f'model.device="{device}"', 'model.dtype="bfloat16"',
        "net.control_port=0",
        'snapshot.dtype="bfloat16"', "staleness.max_staleness=2", "vllm.gpu_memory_utilization=0.3",
    ]  # fmt: skip
    flags = [x for s in base + sets for x in ("--set", s)]
    consumer_out = out / f"{label}-consumer.out"
    consumer = cli(
        "consumer", "--run-dir", str(run_dir), "--steps", str(steps), *flags, log=consumer_out
    )
    deadline = time.time() + 300
    while not (run_dir / RF.ENDPOINTS).exists():
        if consumer.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"consumer did not start: see {consumer_out}")
        time.sleep(0.2)
    ep = RF.read_endpoints(run_dir / RF.ENDPOINTS).control
    plog = out / f"{label}-producer.log"
    producer = cli(
        "producer", "--connect", ep, "--engine", engine, "--id", f"{engine}0", *flags, log=plog
    )
    try:
        code = consumer.wait(timeout_s)
        producer.wait(120)
    finally:
        for p in (consumer, producer):
            if p.poll() is None:
                p.kill()
    metrics = read_steps(run_dir / RF.METRICS)
    ledger = RF.read_ledger(run_dir)
    first, last = metrics[0], metrics[-1]
    wall = last.time_s - first.time_s
    later = metrics[1:]
    loaded = loaded_times(plog)
    delays = [
        loaded[m.step] - (m.unix_time - m.publish_submit_s) for m in metrics if m.step in loaded
    ]
    submits = [m.publish_submit_s for m in later]
    writes = [m.snapshot_write_s for m in later if m.snapshot_write_s]
    step_s = statistics.median(m.step_s or 0.0 for m in metrics)
    return {
        "label": label,
        "exit_code": code,
        "steps": len(metrics),
        "wall_s_after_first_step": wall,
        "s_per_step": wall / max(len(later), 1),
        "learner_idle_frac": sum(m.wait_s for m in later) / wall if wall else None,
        "tokens_per_s": sum(m.num_completion_tokens for m in later) / wall if wall else None,
        "learner_step_s_median": step_s,
        "wall_over_step": wall / max(len(later), 1) / step_s,
        "publish_submit_s_median": statistics.median(submits) if submits else None,
        "publish_submit_s_max": max(submits) if submits else None,
        "snapshot_write_s_median": statistics.median(writes) if writes else None,
        "snapshots_superseded": last.snapshots_superseded,
        "staleness_mean": statistics.fmean(m.staleness_mean for m in metrics),
        "staleness_max": max(m.staleness_max for m in metrics),
        "tis_weight_mean": statistics.fmean(m.tis_weight_mean or 0.0 for m in metrics),
        "behavior_gap_abs_mean": statistics.fmean(m.behavior_gap_abs_mean or 0.0 for m in metrics),
        "reward_first": first.reward_mean,
        "reward_last": last.reward_mean,
        "reload_delay_s_median": statistics.median(delays) if delays else None,
        "reload_delay_s_max": max(delays) if delays else None,
        "producer_reloads": {  # how the producers got each snapshot, and the time it took
            p: {
                k: v for k, v in s.counters.items() if k.startswith("snapshot") or k in _RELOAD_KEYS
            }
            for p, s in RF.latest_producers(run_dir, last).items()
        },
        "ledger": ledger.balance.to_json(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--label", default="pipeline")
    ap.add_argument("--timeout", type=float, default=500)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--engine", default="vllm", help="vllm; fake or hf to try the script on a CPU")
    ap.add_argument("--device", default="cuda", help="the learner's device (cpu to try it)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    res = run(
        a.model,
        a.out,
        steps=a.steps,
        label=a.label,
        sets=a.sets,
        timeout_s=a.timeout,
        engine=a.engine,
        device=a.device,
    )
    (a.out / f"{a.label}.json").write_text(json.dumps(res, indent=1))
    for k, v in res.items():
        print(f"{k:28s} {v:.4g}" if isinstance(v, float) else f"{k:28s} {v}")


if __name__ == "__main__":
    main()
