"""What recording the stream costs, and what a replay costs, on the demo (one machine).

    python bench/replay.py [--steps 300] [--pairs 1] [--json PATH] [--keep DIR]

Each pair runs `asyncgrpo launch --no-eval` (launch/configs/demo.toml: max_staleness 2, hf
producers, held-out evaluation every eval.learner_every_steps steps) twice, one after the other,
with `run.record_stream` on and off (the order alternates between pairs), then replays the recorded
run with `asyncgrpo replay` (the run's own config). Times in seconds, from each run's metrics.jsonl:
- s_per_step: (end of the last step - end of the first) / (steps - 1), periodic evaluation
  included (the same in every run);
- loop_s: the learner loop's clock at the last step (`time_s`): a replay's loop against the
  original's (no start-up, model loading or final plots on either side);
- command_s: the whole command's wall time, start to exit (`asyncgrpo launch --no-eval`: the
  producers' start and the run; `asyncgrpo replay`: the check of the stream, the run, the
  plots and the hash comparison).

JSON keys (stable; medians over pairs): on_s_per_step, off_s_per_step, recording_overhead
(on / off - 1: under another load it measures the load), recording_s_per_step (recording the
run's stream again in this process, its groups decoded beforehand: puts, encoding, writes, per
step) and recording_over_off_step (that / off_s_per_step: the recorder's work apart from the
load), replay_s_per_step, replay_over_original (replay loop_s / the recorded run's loop_s),
replay_over_original_command (the same for command_s), versions_compared and hashes_equal
(every replay: all snapshot hashes equal), stream_bytes (the recorded run's RUN/stream/),
stream_bytes_per_token (per completion token trained), group_bytes_per_token (the groups' wire
bytes alone), checkpoint_bytes (its checkpoint directory: fp32 weights and AdamW moments),
steps, pairs, cpus, load_avg_1min_start, load_avg_1min_end, and runs: every run's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def asyncgrpo(*args: str, log: Path) -> tuple[str, float]:
    """Run the CLI to completion: its output (also in `log`) and the command's wall time in
    seconds; fail loudly on a non-zero exit."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "launch.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, check=False)  # fmt: skip
    wall = time.perf_counter() - t0
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"asyncgrpo {' '.join(args)} failed; see {log}")
    return done.stdout, wall


def step_times(run_dir: Path) -> dict[str, float]:
    from common.files import run_files as RF
    from common.files.metrics import read_steps

    records = read_steps(run_dir / RF.METRICS)
    span = records[-1].time_s - records[0].time_s
    return {"s_per_step": span / max(len(records) - 1, 1), "loop_s": records[-1].time_s}


def launch(out: Path, steps: int, record: bool) -> dict[str, Any]:
    flag = f"run.record_stream={str(record).lower()}"
    _, wall = asyncgrpo("launch", "--run-dir", str(out), "--steps", str(steps), "--no-live",
                        "--no-eval", "--set", flag, log=out.with_suffix(".log"))  # fmt: skip
    return {"run": out.name, "record_stream": record, **step_times(out), "command_s": wall}


def replay(source: Path, out: Path) -> dict[str, Any]:
    text, wall = asyncgrpo("replay", str(source), "--run-dir", str(out),
                           log=out.with_suffix(".log"))  # fmt: skip
    equal = re.search(r"all (\d+) versions compared equal", text)
    compared = re.search(r"of (\d+) compared", text)
    found = equal or compared
    return {
        "run": out.name, **step_times(out), "command_s": wall,
        "hashes_equal": equal is not None,
        "versions_compared": int(found.group(1)) if found else 0,
    }  # fmt: skip


def sizes(run_dir: Path) -> dict[str, float]:
    from consumer.stream.reader import index

    rec = index(run_dir / "stream")
    stream = sum(p.stat().st_size for p in (run_dir / "stream").iterdir())
    ckpt = sum(p.stat().st_size for p in (run_dir / "checkpoints").rglob("*") if p.is_file())
    return {
        "stream_bytes": stream, "stream_bytes_per_token": stream / max(rec.tokens, 1),
        "group_bytes_per_token": rec.group_bytes / max(rec.tokens, 1), "checkpoint_bytes": ckpt,
    }  # fmt: skip


def recording_cpu(run_dir: Path, scratch: Path) -> float:
    """Seconds per step that recording `run_dir`'s stream again takes in this process (the
    training thread's puts, the recorder thread's encoding and writes, until closed): the
    recorder's work, apart from the load of whatever else shares the machine."""
    from common import wire
    from consumer.stream.reader import index, load_group
    from consumer.stream.recorder import Recorder

    rec = index(run_dir / "stream")
    steps = [([load_group(at, wire.Limits(), step=s.entry.version) for at in s.groups], s.entry)
             for s in rec.steps]  # fmt: skip
    t0 = time.perf_counter()
    recorder = Recorder(scratch)
    for groups, entry in steps:
        for g in groups:
            recorder.group(g)
        recorder.step(entry)
    recorder.close()
    return (time.perf_counter() - t0) / max(len(steps), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", type=Path, help="keep the runs here (default: a temp directory)")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        runs: list[dict[str, Any]] = []
        on, off, rep, cpu, size = [], [], [], [], {}
        for i in range(args.pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            pair = {r: launch(base / f"p{i}-{'on' if r else 'off'}", args.steps, r) for r in order}
            on.append(pair[True])
            off.append(pair[False])
            r = replay(base / f"p{i}-on", base / f"p{i}-replay")
            r["replay_over_original"] = r["loop_s"] / pair[True]["loop_s"]
            r["replay_over_original_command"] = r["command_s"] / pair[True]["command_s"]
            rep.append(r)
            runs += [pair[order[0]], pair[order[1]], r]
            size = sizes(base / f"p{i}-on")
            cpu.append(recording_cpu(base / f"p{i}-on", base / f"p{i}-rerecord"))
        med = statistics.median
        out = {
            "on_s_per_step": med(x["s_per_step"] for x in on),
            "off_s_per_step": med(x["s_per_step"] for x in off),
            "replay_s_per_step": med(x["s_per_step"] for x in rep),
            "replay_over_original": med(x["replay_over_original"] for x in rep),
            "replay_over_original_command": med(x["replay_over_original_command"] for x in rep),
            "versions_compared": min(x["versions_compared"] for x in rep),
            "hashes_equal": all(x["hashes_equal"] for x in rep),
            **size, "steps": args.steps, "pairs": args.pairs, "cpus": len(os.sched_getaffinity(0)),
            "load_avg_1min_start": load_start, "load_avg_1min_end": os.getloadavg()[0],
            "runs": runs,
        }  # fmt: skip
        out["recording_overhead"] = out["on_s_per_step"] / out["off_s_per_step"] - 1
        out["recording_s_per_step"] = med(cpu)
        out["recording_over_off_step"] = out["recording_s_per_step"] / out["off_s_per_step"]
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
