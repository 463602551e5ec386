"""The hostile-code suite: programs that attack their sandbox, each contained and asserted.

Contained means: the execution ends with one of the case's reasons, the host's files under a
planted directory (keys, a run directory) are byte-for-byte unchanged, nothing was written to
home, no connection reached a socket listening on the host's loopback, no process of the
sandbox outlives the call, and this process (the producer's stand-in, named to the program as
the one to kill) goes on. Through the reward runner: every hostile completion scores 0 with its
reason counted, the reward worker survives, and the next honest group scores right.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hostile_code import hostile_cases, plant, snapshot

from common.config import RewardSpec
from producer.rewards.runner import RewardRunner
from producer.sandbox import Limits, mechanism, run_python
from producer.sandbox.cgroups import PREFIX, V1_ROOTS, ExecutionGroups
from producer.sandbox.runner import UID_BASE, UID_SPAN

QUICK = Limits(wall_s=1.0, cpu_s=1, memory_mib=128, max_processes=8, max_output_bytes=256 << 10)
CASES = list(hostile_cases(Path("/x"), 1, 1))


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP socket listening on the host's loopback, never accepting by itself."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        yield server


def sandbox_processes() -> list[int]:
    """PIDs of live processes running as a user id of this process's executions (another
    process's sandboxes, another suite's included, have user ids of their own)."""
    first = UID_BASE + (os.getpid() * 4096) % UID_SPAN
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            uid = entry.stat().st_uid
        except FileNotFoundError:
            continue
        if first <= uid < first + 4096:
            out.append(int(entry.name))
    return out


def assert_untouched(outside: Path, before: dict[str, bytes], server: socket.socket) -> None:
    assert snapshot(outside) == before
    assert not (Path.home() / "planted").exists()
    with pytest.raises(BlockingIOError):
        server.accept()  # nothing connected


@pytest.mark.skipif(os.geteuid() != 0, reason="process ids by user id: the root mechanism")
@pytest.mark.parametrize("name", CASES)
def test_a_hostile_program_is_contained(name, tmp_path, listener):
    before = plant(tmp_path)
    port = listener.getsockname()[1]
    program, reasons = hostile_cases(tmp_path, port, os.getpid())[name]
    run = run_python(program, limits=QUICK)
    assert run.reason in reasons, (run.reason, run.stderr[-500:])
    for word in ("LEAKED", "WROTE", "CONNECTED"):
        assert word not in run.stdout
    assert len(run.stdout.encode()) + len(run.stderr.encode()) <= QUICK.max_output_bytes
    assert_untouched(tmp_path, before, listener)
    assert sandbox_processes() == []


def test_an_honest_program_reads_stdin_writes_its_tmp_and_reports_its_exit(tmp_path):
    program = (
        "import os, sys\nopen('/tmp/scratch', 'w').write(sys.stdin.read())\n"
        "print(open('/tmp/scratch').read().upper(), os.getcwd())\nsys.exit(3)"
    )
    run = run_python(program, stdin="hello", limits=QUICK)
    assert (run.reason, run.exit_code, run.stdout.split()) == ("error", 3, ["HELLO", "/tmp"])
    assert run_python("print(2 + 2)", limits=QUICK).stdout == "4\n"


def test_the_memory_limit_stops_an_allocation_past_it_and_allows_one_below_it():
    below = run_python("x = bytearray(32 << 20)\nprint(len(x))", limits=QUICK)
    above = run_python("x = bytearray(200 << 20)", limits=QUICK)
    assert (below.reason, above.reason) == ("ok", "memory")


def test_the_process_limit_counts_the_executions_processes():
    program = (
        "import os, time\nn = 0\ntry:\n    for _ in range(20):\n        if os.fork() == 0:\n"
        "            time.sleep(5)\n            os._exit(0)\n        n += 1\nexcept OSError:\n"
        "    pass\nprint(n)"
    )
    run = run_python(program, limits=dataclasses.replace(QUICK, wall_s=10))
    assert run.reason == "ok"
    assert int(run.stdout) == QUICK.max_processes - 1  # the program itself is one


def test_this_host_gets_the_namespace_mechanism():
    """Root with network namespaces (this machine, CI): the strongest mechanism."""
    if os.geteuid() != 0:
        pytest.skip("not root")
    assert mechanism() == "bwrap-root"


def _completion(program: str) -> str:
    return f"Here is my solution:\n```python\n{program}\n```\n"


async def _score_hostile(names: list[str], tmp_path: Path, server: socket.socket) -> None:
    before = plant(tmp_path)
    cases = hostile_cases(tmp_path, server.getsockname()[1], os.getpid())
    hostile = [_completion(cases[n][0]) for n in names]
    honest = [_completion("def solve():\n    return 42"), _completion("def solve():\n    return 1")]
    columns = '{"tests": ["assert solve() == 42"]}'
    spec = [RewardSpec("code_tests")]
    async with asyncio.timeout(120), RewardRunner(spec, timeout_s=10, workers=1) as runner:
        scored = await runner.score(hostile, "", columns=columns)
        counted = dict(runner.contained)
        again = await runner.score(honest, "", columns=columns)
    np.testing.assert_array_equal(scored.rewards, np.zeros(len(names)))
    assert (scored.num_errors, scored.num_timeouts, runner.num_pool_restarts) == (0, 0, 0)
    assert sum(counted.values()) == len(names)
    for n in names:
        assert any(counted.get(r) for r in cases[n][1]), (n, counted)
    np.testing.assert_array_equal(again.rewards, [1.0, 0.0])
    assert_untouched(tmp_path, before, server)


async def test_hostile_completions_score_zero_with_reasons_counted_and_scoring_goes_on(
    tmp_path, listener
):
    """Every case, through the built-in `code_tests` reward in a real reward worker."""
    await _score_hostile(CASES, tmp_path, listener)


@pytest.mark.parametrize(
    ("program", "reason", "said"),
    [
        ("import socket\nsocket.create_connection(('127.0.0.1', 9))", "error", "socket"),
        ("open('/etc/hostname').read()", "error", "outside the sandbox"),
        ("import os\nos.system('true')", "error", "refused"),
        ("x = bytearray(200 << 20)", "memory", "MemoryError"),
        ("import time\ntime.sleep(60)", "timeout", ""),
    ],
)
def test_without_namespaces_the_audit_hook_refuses_and_the_rlimits_hold(
    monkeypatch, program, reason, said
):
    """The rlimits mechanism (a host where no namespace can be made), forced here."""
    monkeypatch.setattr("producer.sandbox.runner.mechanism", lambda: "rlimits")
    run = run_python(program, limits=QUICK)
    assert run.reason == reason
    assert said in run.stderr


def test_an_execution_runs_in_cgroups_of_its_own_removed_after_it():
    """Where the host lets the producer write cgroup v1's cpu and pids hierarchies (here):
    a CPU quota and a process cap for all the execution's processes together."""
    writable = [k for k, root in V1_ROOTS.items() if os.access(root, os.W_OK)]
    if os.geteuid() != 0 or not writable:
        pytest.skip("no writable cgroup v1 hierarchy")
    run = run_python("print(open('/proc/self/cgroup').read())", limits=Limits(cpu_share=0.5))
    lines = dict(line.split(":", 2)[1:] for line in run.stdout.split())
    for kind in writable:
        assert lines[kind].startswith(f"/{PREFIX}{os.getpid()}-")  # beside the producer
    for kind in writable:
        assert not list(V1_ROOTS[kind].glob(f"{PREFIX}{os.getpid()}-*"))


BURN = """import sys, time
open(sys.argv[1], "w").write("0")  # this process joins the group, then computes
t0 = time.process_time()
while time.process_time() - t0 < float(sys.argv[2]):
    pass
"""


def _throttled_after_burning(groups: ExecutionGroups, cpu_s: float) -> int:
    """Periods the group was held back, after a process in it computed for `cpu_s`."""
    procs = groups.procs_files()["cpu"]
    subprocess.run([sys.executable, "-I", "-S", "-c", BURN, str(procs), str(cpu_s)], check=True)
    stat = dict(line.split() for line in (groups.dirs["cpu"] / "cpu.stat").read_text().splitlines())
    return int(stat["nr_throttled"])


def test_a_short_program_is_not_throttled_by_a_quarter_cpu_quota():
    """code_tests' share (a quarter CPU: 25 ms of every 100 ms period) with its start burst:
    a program's first 40 ms of CPU (an honest one takes ~25) run unthrottled."""
    if os.geteuid() != 0 or not os.access(V1_ROOTS["cpu"], os.W_OK):
        pytest.skip("no writable cgroup v1 cpu hierarchy")
    groups = ExecutionGroups.make(cpu_share=0.25, max_processes=4)
    try:
        directory = groups.dirs["cpu"]
        assert (directory / "cpu.cfs_quota_us").read_text().strip() == "25000"
        if not (directory / "cpu.cfs_burst_us").exists():
            pytest.skip("this kernel has no cpu.cfs_burst_us")
        assert (directory / "cpu.cfs_burst_us").read_text().strip() == "25000"
        assert _throttled_after_burning(groups, 0.04) == 0
    finally:
        groups.remove()
    assert not directory.exists()
