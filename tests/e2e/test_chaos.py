"""Chaos: SIGKILL the consumer or a producer at random moments, restart it, again and again.

A consumer (a real tiny model, so checkpoints and snapshots take real writes) and 3 fake
producers run through the CLI. `chaos()` kills a random one at a random moment, many times:
some kills are aimed at the consumer while a snapshot or a checkpoint is being written (a
temporary directory of either is on disk). A killed consumer restarts with `--resume`, a killed
producer under the same id. At the end the consumer gets one SIGTERM, and then:

- every lease has exactly one outcome and the ledger balances against leases.jsonl (nothing
  lost), no lease is trained twice and every step trained exactly P of them;
- every trained group was within the staleness bound (`trained_step - behavior_version`);
- the snapshot final.json names exists, verifies against its manifest and fits the model;
- every process ever started has exited by itself (the producers heard the end, or gave up).

`python tests/e2e/test_chaos.py RUN_DIR [KILLS] [SEED]` runs it by hand and prints the counts.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # procs, tiny_models, ...
from ledger_invariant import assert_run_balanced
from procs import cli, read_jsonl, wait_for

from common.files import run_files as RF

P = 2  # prompts per step
MAX_STALENESS = 2


def _consumer(tmp: Path, run_dir: Path, model: Path, *, resume: bool, n: int):
    sets = [
        "sampling.group_size=4", f"train.prompts_per_step={P}", "net.control_port=0",
        f"staleness.max_staleness={MAX_STALENESS}", "train.checkpoint_every=2",
        "net.heartbeat_s=0.2", "net.producer_timeout_s=4", "net.resend_after_s=3",
        "task.source=jsonl", f"task.path={tmp / 'prompts.jsonl'}", "model.device=cpu",
        "sampling.max_new_tokens=8", "eval.learner_every_steps=0",
    ]  # fmt: skip
    args = ["consumer", "--run-dir", str(run_dir), "--steps", "1000000", "--model", str(model)]
    for s in sets:
        args += ["--set", s]
    if resume:
        args.append("--resume")
    return cli(*args, log=tmp / f"consumer-{n}.log")


def _producer(tmp: Path, ep: str, name: str, n: int):
    return cli(
        "producer", "--connect", ep, "--engine", "fake", "--id", name,
        "--set", "net.heartbeat_s=0.2", "--set", "fake.latency_s=0.05",
        "--set", "net.consumer_timeout_s=60", log=tmp / f"{name}-{n}.log",
    )  # fmt: skip


def _writing(run_dir: Path) -> str | None:
    """'checkpoint' or 'snapshot' while a temporary directory of one is on disk."""
    for where in ("checkpoints", "snapshots"):
        try:
            names = os.listdir(run_dir / where)
        except FileNotFoundError:
            continue
        if any(".tmp-" in name for name in names):
            return where[:-1]
    return None


def _listening(log: Path) -> bool:
    return log.exists() and "listening on" in log.read_text()


def start_run(tmp: Path, run_dir: Path) -> tuple[Path, str, list[subprocess.Popen[bytes]]]:
    """The tiny model (~3M parameters) and 200 prompts in `tmp`; the consumer on `run_dir`,
    then 3 fake producers p1-p3: (the model, the control endpoint, [consumer, producers])."""
    from tiny_models import build_tiny_model

    model = build_tiny_model(tmp / "model", hidden=256, layers=4)
    rows = (json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) for i in range(200))
    (tmp / "prompts.jsonl").write_text("".join(row + "\n" for row in rows))
    cons = _consumer(tmp, run_dir, model, resume=False, n=0)
    wait_for(lambda: _listening(tmp / "consumer-0.log"), timeout_s=300, what="the consumer")
    ep = RF.read_endpoints(run_dir / RF.ENDPOINTS).control
    return model, ep, [cons, *(_producer(tmp, ep, name, 0) for name in ("p1", "p2", "p3"))]


def chaos(tmp: Path, *, kills: int, seed: int) -> dict[str, int]:
    """Run the chaos and check everything the module doc lists; returns the counts."""
    rng = random.Random(seed)
    run_dir = tmp / "run"
    counts: Counter[str] = Counter()
    n = 0
    model, ep, started = start_run(tmp, run_dir)
    cons = started[0]
    producers = dict(zip(("p1", "p2", "p3"), started[1:], strict=True))
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "LATEST").exists(), timeout_s=300,
                 what="a first checkpoint", procs=[cons])  # fmt: skip
        for k in range(kills):
            n += 1
            aim = rng.random()
            if aim < 0.5:  # the consumer: at once, at a random moment, or while it writes
                if aim >= 0.15:  # most kills only once it trained a step since it (re)started
                    done = len(read_jsonl(run_dir / RF.METRICS))
                    wait_for(lambda done=done: len(read_jsonl(run_dir / RF.METRICS)) > done,
                             timeout_s=300, what="a step", procs=[cons])  # fmt: skip
                want = "any" if aim < 0.3 else "snapshot" if aim < 0.4 else "checkpoint"
                deadline = time.monotonic() + rng.uniform(0.0, 2.0)
                while True:
                    what = _writing(run_dir)
                    if what is not None and want == what:
                        counts[f"kills_during_{what}"] += 1
                        break
                    if want == "any" and time.monotonic() > deadline:
                        break
                    if time.monotonic() > deadline + 30:
                        break  # no write came: kill anyway
                    time.sleep(0.001)
                assert cons.poll() is None, f"the consumer died by itself (kill {k})"
                cons.send_signal(signal.SIGKILL)
                cons.wait(30)
                counts["consumer_kills"] += 1
                cons = _consumer(tmp, run_dir, model, resume=True, n=n)
                started.append(cons)
                log = tmp / f"consumer-{n}.log"
                wait_for(lambda log=log: _listening(log), timeout_s=300,
                         what=f"consumer {n} to resume", procs=[cons])  # fmt: skip
            else:
                time.sleep(rng.uniform(0.0, 2.0))
                name = rng.choice(sorted(producers))
                victim = producers[name]
                victim.send_signal(signal.SIGKILL)
                victim.wait(30)
                counts["producer_kills"] += 1
                producers[name] = _producer(tmp, ep, name, n)
                started.append(producers[name])
            for name, p in producers.items():  # exited by itself meanwhile: restart it
                code = p.poll()
                if code is not None:
                    # only "no welcome within net.handshake_timeout_s" (the consumer was down
                    # that long) is expected; anything else is a crash
                    assert code == 2, (name, code)
                    counts["producer_handshake_timeouts"] += 1
                    producers[name] = _producer(tmp, ep, name, n)
                    started.append(producers[name])
        # let it train a little more, then the one clean stop
        target = len(read_jsonl(run_dir / RF.METRICS)) + 3
        wait_for(lambda: len(read_jsonl(run_dir / RF.METRICS)) >= target, timeout_s=300,
                 what="3 more steps", procs=[cons])  # fmt: skip
        cons.send_signal(signal.SIGTERM)
        assert cons.wait(300) == 0, (tmp / f"consumer-{n}.log").read_text()[-3000:]
        for name, p in producers.items():  # they stop by themselves: told, or timed out
            code = p.wait(120)
            counts[f"producer_exit_{code}"] += 1
            assert code == 0, (name, (tmp / f"{name}-{n}.log").read_text()[-2000:])
    finally:
        for p in started:
            if p.poll() is None:
                counts["left_running"] += 1
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    result = {**counts, **check_run(run_dir, model), "processes_started": len(started)}
    result.setdefault("left_running", 0)
    return result


def check_run(run_dir: Path, model: Path) -> dict[str, int]:
    from common.weights import snapshot as snap

    out: dict[str, int] = {}
    ledger = assert_run_balanced(run_dir)  # every lease final, ledger == leases.jsonl
    leases = RF.read_leases(run_dir)
    ids = [r.lease_id for r in leases]
    assert len(ids) == len(set(ids)), "a lease ended twice"
    trained = [r for r in leases if r.state == "trained"]
    steps = read_jsonl(run_dir / RF.METRICS)
    assert [m["step"] for m in steps] == list(range(1, len(steps) + 1))
    per_step = Counter(r.trained_step for r in trained)
    assert per_step == Counter({s: P for s in range(len(steps))}), "a step trained twice"
    lags = [r.staleness for r in trained]
    assert min(lags) >= 0
    assert max(lags) <= MAX_STALENESS
    final = snap.final_version(run_dir)
    assert final == len(steps)
    directory = snap.snapshot_dir(run_dir / "snapshots", final)
    manifest = snap.read_manifest(directory)
    snap.verify_file(directory / snap.WEIGHTS_FILE, expected_hash=manifest.hash,
                     expected_bytes=manifest.num_bytes)  # fmt: skip
    shapes = snap.tensor_shapes(model)
    snap.check_fits(snap.tensor_shapes(directory), shapes, directory,
                    optional=("lm_head.weight",))  # fmt: skip
    assert max(snap.list_versions(run_dir / "snapshots")) == final
    out["steps"] = len(steps)
    out["leases"] = len(leases)
    out["trained"] = len(trained)
    out["expired"] = ledger.balance.expired
    out["trained_twice"] = len(trained) - len({r.lease_id for r in trained})
    out["lost"] = ledger.balance.open
    out["max_lag"] = max(lags)
    return out


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_fifty_random_kills_lose_nothing_and_train_nothing_twice(tmp_path):
    counts = chaos(tmp_path, kills=50, seed=0)
    print(f"\nchaos: {counts}")
    assert counts["consumer_kills"] + counts["producer_kills"] == 50
    assert counts.get("kills_during_checkpoint", 0) >= 1
    assert counts.get("kills_during_snapshot", 0) >= 1
    assert counts["left_running"] == 0
    assert (counts["lost"], counts["trained_twice"]) == (0, 0)


if __name__ == "__main__":
    t0 = time.perf_counter()
    result = chaos(Path(sys.argv[1]), kills=int(sys.argv[2]) if len(sys.argv) > 2 else 100,
                   seed=int(sys.argv[3]) if len(sys.argv) > 3 else 0)  # fmt: skip
    print(json.dumps({**result, "wall_s": round(time.perf_counter() - t0)}))
