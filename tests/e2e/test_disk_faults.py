"""A full disk, again and again: the run directory on a small tmpfs that is filled at random
moments while a consumer (a real tiny model) and 3 fake producers run through the CLI.

Each time, the consumer either goes on (a metrics line lost is counted in the next line) or
stops by itself with one line naming the file it could not write (exit 1); then the filler is
removed and the consumer restarts with `--resume`. At the end, one SIGTERM, and the checks of
the kill -9 chaos (tests/e2e/test_chaos.py `check_run`): every lease has one outcome, the ledger
balances against leases.jsonl, no lease is trained twice, every step trained exactly P groups,
the final snapshot verifies; and the recorded stream reads back whole, every record's hash
checked.

`python tests/e2e/test_disk_faults.py TMP_DIR [FAULTS] [SEED]` runs it by hand.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import read_jsonl, wait_for
from small_disk import fill, free_up, small_disk
from test_chaos import _consumer, _listening, _producer, _writing, check_run, start_run

from common.files import run_files as RF

STOP_LINE = re.compile(r"cannot write (\S+): (.+?) \((E[A-Z]+)\); the run stopped")


def _stopped_by_disk(log: Path) -> tuple[str, str] | None:
    """(the file, the errno name) of the consumer's stop line, if it printed one."""
    found = STOP_LINE.findall(log.read_text()) if log.exists() else []
    return (found[-1][0], found[-1][2]) if found else None


def disk_faults(tmp: Path, *, faults: int, seed: int) -> dict[str, int]:

    from consumer.stream.reader import index

    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    with small_disk(tmp / "disk", 320) as disk:
        run_dir = disk / "run"
        n = 0
        model, ep, started = start_run(tmp, run_dir)
        cons = started[0]
        producers = dict(zip(("p1", "p2", "p3"), started[1:], strict=True))
        try:
            wait_for(
                lambda: (run_dir / "checkpoints" / "LATEST").exists(),
                timeout_s=300,
                what="a first checkpoint",
                procs=[cons],
            )
            while counts["faults"] < faults:
                done = len(read_jsonl(run_dir / RF.METRICS))
                wait_for(
                    lambda done=done: len(read_jsonl(run_dir / RF.METRICS)) > done,
                    timeout_s=300,
                    what="a step",
                    procs=[cons],
                )
                aim = rng.random()  # at a random moment, or while a checkpoint is written
                deadline = time.monotonic() + rng.uniform(0.0, 1.5)
                while time.monotonic() < deadline + (30 if aim < 0.3 else 0):
                    if aim < 0.3 and _writing(run_dir) == "checkpoint":
                        counts["faults_during_checkpoint"] += 1
                        break
                    time.sleep(0.001)
                used_mib = shutil.disk_usage(disk).used >> 20  # the run's own files
                counts["run_mib_max"] = max(counts["run_mib_max"], used_mib)
                fill(disk)
                counts["faults"] += 1
                log = tmp / f"consumer-{n}.log"
                try:
                    code = cons.wait(120)
                except subprocess.TimeoutExpired:  # went on (only lossy writes failed)
                    counts["went_on"] += 1
                    free_up(disk)
                    continue
                assert code == 1, (code, log.read_text()[-3000:])
                stopped = _stopped_by_disk(log)
                assert stopped is not None, log.read_text()[-3000:]
                assert stopped[1] == "ENOSPC"
                counts[f"stopped_at:{Path(stopped[0]).name}"] += 1
                counts["stops"] += 1
                free_up(disk)
                n += 1
                cons = _consumer(tmp, run_dir, model, resume=True, n=n)
                started.append(cons)
                log = tmp / f"consumer-{n}.log"
                wait_for(
                    lambda log=log: _listening(log),
                    timeout_s=300,
                    what=f"consumer {n} to resume",
                    procs=[cons],
                )
                for name, p in producers.items():  # gave up on the consumer meanwhile
                    if p.poll() is not None:
                        assert p.returncode == 2, (name, p.returncode)
                        producers[name] = _producer(tmp, ep, name, n)
                        started.append(producers[name])
            target = len(read_jsonl(run_dir / RF.METRICS)) + 3
            wait_for(
                lambda: len(read_jsonl(run_dir / RF.METRICS)) >= target,
                timeout_s=300,
                what="3 more steps",
                procs=[cons],
            )
            cons.send_signal(signal.SIGTERM)
            assert cons.wait(300) == 0, (tmp / f"consumer-{n}.log").read_text()[-3000:]
            for name, p in producers.items():
                assert p.wait(120) == 0, (name, (tmp / f"{name}-{n}.log").read_text()[-2000:])
        finally:
            for p in started:
                if p.poll() is None:
                    counts["left_running"] += 1
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        lost_lines = [m.get("metrics_lines_lost") or 0 for m in read_jsonl(run_dir / RF.METRICS)]
        counts["metrics_lines_lost_reported"] = max(lost_lines)
        recording = index(run_dir / "stream")  # every record's hash checked
        counts["stream_steps"] = len(recording.steps)
        result = {**counts, **check_run(run_dir, model), "processes_started": len(started)}
    result.setdefault("left_running", 0)
    return result


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_twenty_full_disks_lose_nothing_and_train_nothing_twice(tmp_path):
    counts = disk_faults(tmp_path, faults=20, seed=0)
    print(f"\ndisk faults: {counts}")
    assert counts["faults"] == 20
    assert counts["stops"] >= 1
    assert counts["left_running"] == 0
    assert (counts["lost"], counts["trained_twice"]) == (0, 0)


if __name__ == "__main__":
    t0 = time.perf_counter()
    result = disk_faults(
        Path(sys.argv[1]),
        faults=int(sys.argv[2]) if len(sys.argv) > 2 else 20,
        seed=int(sys.argv[3]) if len(sys.argv) > 3 else 0,
    )
    print(json.dumps({**result, "wall_s": round(time.perf_counter() - t0)}))
