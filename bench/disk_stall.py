"""Heartbeats while the consumer's disk stalls: the longest gap between heartbeat replies.

    python bench/disk_stall.py [--stall-s 5] [--json PATH]

A consumer's network thread (`Server`, in this process, on loopback) serves one producer that
sends a heartbeat every 50 ms. A step is settled, and the append of its finished lease to
leases.jsonl (the books' writer thread) is made to hang `--stall-s` seconds, as a stalled disk
would. `gap_stalled_s`: the longest time between two heartbeat replies from the settlement to
the end of the stall; `gap_clean_s`: the same with no stall (the baseline, same run). Target:
gap_stalled_s <= 2 s during a 5 s stall. `stall_s` is the stall as measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from served import one_group_admitted, request

from common import wire
from common.files import run_files as RF


def gap(stall_s: float) -> tuple[float, float]:
    """(the longest gap between heartbeat replies over the stall's span, the stall measured)."""
    stalled: dict[str, float] = {}
    append = RF.append_leases

    def slow(run_dir: Path, lines: Any) -> None:
        lines = list(lines)
        if lines and stall_s and "start" not in stalled:
            stalled["start"] = time.monotonic()
            time.sleep(stall_s)
            stalled["end"] = time.monotonic()
        append(run_dir, lines)

    RF.append_leases = slow
    try:
        with tempfile.TemporaryDirectory() as tmp, one_group_admitted(Path(tmp)) as admitted:
            srv, control, _, got = admitted
            t0 = time.monotonic()
            srv.settle_trained([got], trained_step=0)
            replies, n = [t0], 10
            while time.monotonic() < t0 + max(stall_s, 1.0) + 0.5:
                request(control, wire.Heartbeat(n, "p", 0, "idle", 0))
                replies.append(time.monotonic())
                n += 1
                time.sleep(0.05)
            srv.wait_books()
    finally:
        RF.append_leases = append
    gaps = [b - a for a, b in itertools.pairwise(replies)]
    return max(gaps), stalled.get("end", 0.0) - stalled.get("start", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stall-s", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    clean, _ = gap(0.0)
    stalled, stall = gap(args.stall_s)
    out = {
        "stall_s": stall,
        "gap_stalled_s": stalled,
        "gap_clean_s": clean,
        "load_1m": os.getloadavg()[0],
    }
    for key, value in out.items():
        print(f"{key:16s} {value:.3f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
