"""The code sandbox: its start-up cost per execution, and honest groups beside hostile ones.

    python bench/sandbox.py [--repeats 40] [--groups 30] [--rounds 5] [--busy 0] [--json PATH]

- `start_overhead_ms`: the median wall time of `run_python("pass")` (the sandbox of this host's
  mechanism: bwrap's namespaces, the prelude's rlimits and user id, the interpreter) less the
  median of the same interpreter started bare with the same pipes (`python -I -S -c pass`
  through subprocess). Target <= 20 ms. `bwrap_ms` is bwrap alone around `/bin/true` less
  `/bin/true` bare: the namespaces' own cost. Rounds alternate, medians reported.
- `honest_ratio`: honest groups (G=4 completions of a correct or wrong `add`, 4 tests each)
  scored one after another through `RewardRunner` with the built-in `code_tests` reward and two
  reward workers, groups per second while a second stream scores the ten attacks of
  tests/hostile_code.py once each, back to back, over the rate of as many honest groups with no
  hostile stream. Target >= 0.9. `--rounds` rounds, each one of both, their order alternating
  (a change in the machine's load hits both sides); the median, with `honest_ratio_min` and
  `_max` over the rounds. `--busy N` keeps N processes computing throughout (a producer host
  whose cores also run other work). `hostile_contained` counts the hostile completions scored
  0 with their reason counted (must equal `hostile_scored`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from subprocess import PIPE
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hostile_code import hostile_cases, plant

from common.config import RewardSpec
from producer.rewards.runner import RewardRunner
from producer.sandbox import mechanism, run_python
from producer.sandbox.jail import bwrap_binary

HONEST = ["def add(a, b):\n    return a + b", "def add(a, b):\n    return a - b"]
TESTS = json.dumps({"tests": [f"assert add({i}, {i + 1}) == {2 * i + 1}" for i in range(4)]})


WRAP = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
WRAP += ["--ro-bind", "/", "/", "--", "/bin/true"]


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def start_costs(repeats: int) -> dict[str, float]:
    python = os.path.realpath(sys.executable)
    bare = [python, "-I", "-S", "-c", "pass"]
    bwrap = bwrap_binary()
    rows: dict[str, list[float]] = {"sandbox": [], "bare": [], "bwrap": [], "true": []}
    for _ in range(repeats):
        rows["sandbox"].append(_timed(lambda: run_python("pass")))
        rows["bare"].append(
            _timed(lambda: subprocess.run(bare, stdin=PIPE, capture_output=True, check=True))
        )
        if bwrap:
            rows["bwrap"].append(_timed(lambda: subprocess.run([bwrap, *WRAP], check=True)))
        rows["true"].append(_timed(lambda: subprocess.run(["/bin/true"], check=True)))
    med = {k: statistics.median(v) for k, v in rows.items() if v}
    out = {
        "sandbox_ms": med["sandbox"],
        "bare_ms": med["bare"],
        "start_overhead_ms": med["sandbox"] - med["bare"],
    }
    if "bwrap" in med:
        out["bwrap_ms"] = med["bwrap"] - med["true"]
    return out


async def _honest_stream(
    runner: RewardRunner, groups: int, until: asyncio.Task[int] | None
) -> tuple[int, float]:
    """Honest groups one after another: `groups` of them, or (with `until`) as many as fit
    before that task ends. (groups scored, groups per second)."""
    t0, n = time.perf_counter(), 0
    while (n < groups) if until is None else not until.done():
        completions = [HONEST[(n + j) % 2] for j in range(4)]
        scored = await runner.score(completions, "", columns=TESTS)
        assert sorted(scored.rewards.tolist()) == [0.0, 0.0, 1.0, 1.0], scored.rewards
        n += 1
    return n, n / (time.perf_counter() - t0)


async def _hostile_stream(runner: RewardRunner, programs: list[str]) -> int:
    """Every hostile program once, one after another; how many were scored."""
    for program in programs:
        scored = await runner.score([program], "", columns=TESTS)
        assert scored.rewards.tolist() == [0.0]
    return len(programs)


async def honest_beside_hostile(groups: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        plant(Path(tmp))
        programs = [p for p, _ in hostile_cases(Path(tmp), 9, os.getpid()).values()]
        spec = [RewardSpec("code_tests")]
        rows: dict[str, list[float]] = {"beside": [], "clean": [], "ratio": []}
        hostile_n, size = 0, groups
        async with RewardRunner(spec, timeout_s=10, workers=2) as runner:
            await _honest_stream(runner, 4, None)  # workers started, interpreters warm
            for r in range(rounds):
                if r % 2:  # clean first: as many groups as the last round scored beside
                    _, clean = await _honest_stream(runner, size, None)
                hostile = asyncio.create_task(_hostile_stream(runner, programs))
                n, beside = await _honest_stream(runner, 0, hostile)
                hostile_n += await hostile
                if not r % 2:
                    _, clean = await _honest_stream(runner, max(n, groups), None)
                size = max(n, groups)
                for key, value in zip(rows, (beside, clean, beside / clean), strict=True):
                    rows[key].append(value)
                print(f"round {r}: honest {beside:.2f}/s beside, {clean:.2f}/s clean", flush=True)
            contained = sum(runner.contained.values())
    return {
        "honest_groups_per_s_clean": statistics.median(rows["clean"]),
        "honest_groups_per_s_beside_hostile": statistics.median(rows["beside"]),
        "honest_ratio": statistics.median(rows["ratio"]),
        "honest_ratio_min": min(rows["ratio"]),
        "honest_ratio_max": max(rows["ratio"]),
        "honest_ratios": [round(x, 3) for x in rows["ratio"]],
        "hostile_scored": hostile_n,
        "hostile_contained": contained,
    }


def busy_processes(n: int) -> list[subprocess.Popen[bytes]]:
    """`n` processes that compute until killed (the host's other work)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--groups", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out: dict[str, Any] = {"mechanism": mechanism(), "load_1m": os.getloadavg()[0]}
    out["busy"] = args.busy
    busy = busy_processes(args.busy)
    try:
        out.update(start_costs(args.repeats))
        out.update(asyncio.run(honest_beside_hostile(args.groups, args.rounds)))
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    out["load_1m_end"] = os.getloadavg()[0]
    for key, value in out.items():
        print(f"{key:36s} {value:.3f}" if isinstance(value, float) else f"{key:36s} {value}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
