"""Groups per second through the real stack (fake engine) vs raw ZeroMQ in the same run.

    python bench/transport.py [--groups-per-step 16] [--group-size 8] [--tokens 64] [--steps 60]

- baseline: one process PUSHes pre-encoded groups to a PULL socket over loopback TCP and the
  receiver decodes and validates each (`wire.decode`): the cost of the bytes alone.
- ours: `asyncgrpo consumer` (simulated learner step of 1 µs) and two `asyncgrpo producer
  --engine fake` processes (no generation latency): leases, acks, snapshots every step, ledger.
Prints both rates and their ratio. The learner never waits on purpose here, so the gap is the
price of scheduling, bookkeeping and weight publication per step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import wire
from common.files import run_files as RF
from common.files.metrics import read_steps


def sample_group(group_size: int, tokens: int, lease_id: int) -> wire.Group:
    rng = np.random.default_rng(lease_id)
    return wire.Group(
        lease_id=lease_id, producer_id="bench", prompt_index=0, behavior_version=0,
        prompt_ids=rng.integers(0, 1000, 32, dtype=np.int32),
        completion_ids=rng.integers(0, 1000, group_size * tokens, dtype=np.int32),
        completion_lens=np.full(group_size, tokens, np.int32),
        behavior_logp=-rng.random(group_size * tokens, dtype=np.float32),
        token_versions=np.zeros(0, np.int32), rewards=rng.random(group_size, dtype=np.float32),
        finish_reasons=("length",) * group_size, temperature=1.0,
    )  # fmt: skip


def baseline(n: int, group_size: int, tokens: int) -> float:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    payloads = [wire.encode(sample_group(group_size, tokens, i)) for i in range(64)]
    limits = wire.Limits(vocab_size=32_000, group_size=group_size, temperature=1.0)

    def send() -> None:
        push = ctx.socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{port}")
        for i in range(n):
            push.send(payloads[i % len(payloads)])
        push.close(linger=-1)

    t0 = time.perf_counter()
    sender = threading.Thread(target=send)
    sender.start()
    for _ in range(n):
        wire.decode(pull.recv(), limits)
    elapsed = time.perf_counter() - t0
    sender.join()
    pull.close()
    ctx.term()
    return n / elapsed


def ours(steps: int, per_step: int, group_size: int, tokens: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        prompts = Path(tmp) / "p.jsonl"
        prompts.write_text(
            "".join(json.dumps({"prompt": f"p{i}", "answer": "a"}) + "\n" for i in range(500))
        )
        sets = [
            "train.simulate_step_s=1e-6", f"train.prompts_per_step={per_step}",
            f"sampling.group_size={group_size}", f"sampling.max_new_tokens={tokens}",
            "task.source=jsonl", f"task.path={prompts}", "net.control_port=0",
            "staleness.max_staleness=2", "train.drop_zero_variance=false",
        ]  # fmt: skip
        cli = [sys.executable, "-m", "launch.cli"]
        args = [*cli, "consumer", "--run-dir", str(run), "--steps", str(steps)]
        for s in sets:
            args += ["--set", s]
        consumer = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not (run / RF.ENDPOINTS).exists():
            time.sleep(0.05)
        ep = RF.read_endpoints(run / RF.ENDPOINTS).control
        fake = ["--set", f"fake.min_tokens={tokens}", "--set", f"fake.max_tokens={tokens}"]
        producer = [*cli, "producer", "--connect", ep, "--engine", "fake"]
        producers = [
            subprocess.Popen(
                [*producer, "--id", f"p{i}", "--max-in-flight", str(per_step), *fake],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i in range(2)
        ]
        consumer.wait()
        for p in producers:
            p.wait(60)
        metrics = read_steps(run / RF.METRICS)
    # from the end of the first step (processes started, first snapshot loaded) to the last
    span = metrics[-1].time_s - metrics[0].time_s
    return (len(metrics) - 1) * per_step / span


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups-per-step", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=60)
    a = ap.parse_args()
    n = a.steps * a.groups_per_step
    raw = baseline(n, a.group_size, a.tokens)
    full = ours(a.steps, a.groups_per_step, a.group_size, a.tokens)
    print(
        f"groups of G={a.group_size} x {a.tokens} tokens "
        f"({a.group_size * a.tokens * 8 / 1024:.1f} KiB)"
    )
    print(f"baseline  raw ZeroMQ + decode : {raw:10.1f} groups/s")
    print(f"ours      full stack, fake    : {full:10.1f} groups/s  (snapshot + reload every step)")
    print(f"ratio ours/baseline           : {full / raw:10.3f}")


if __name__ == "__main__":
    main()
