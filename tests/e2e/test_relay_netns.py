"""Two hosts relaying snapshots to each other: a consumer and two producers, each in its own
network namespace (a bridge in the consumer's), each producer with its own mount namespace in
which the consumer's run directory is hidden (no shared filesystem: every snapshot travels over
TCP). Both producers relay; the consumer's fan-out is 1, so while one fetches a version from the
consumer the other waits and then takes it from its peer. Needs root and `ip`; slow (real
processes, ~20 s)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from procs import stop, wait_for

from common.files import run_files as RF

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None,
        reason="needs root, ip and unshare (network and mount namespaces)",
    ),
]
STEPS = 12


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


@pytest.fixture
def hosts():
    """Namespaces c (10.77.0.1, with the bridge), a (.2) and b (.3); removed afterwards."""
    tag = f"{os.getpid() % 100000}"
    names = {role: f"ag{role}{tag}" for role in "cab"}
    try:
        for ns in names.values():
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        c = names["c"]
        sh("ip", "-n", c, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", c, "addr", "add", "10.77.0.1/24", "dev", "br0")
        sh("ip", "-n", c, "link", "set", "br0", "up")
        for i, role in enumerate("ab", start=2):
            ns, here, there = names[role], f"v{role}{tag}", f"p{role}{tag}"
            sh("ip", "link", "add", here, "type", "veth", "peer", "name", there)
            sh("ip", "link", "set", here, "netns", ns)
            sh("ip", "link", "set", there, "netns", c)
            sh("ip", "-n", c, "link", "set", there, "master", "br0")
            sh("ip", "-n", c, "link", "set", there, "up")
            sh("ip", "-n", ns, "addr", "add", f"10.77.0.{i}/24", "dev", here)
            sh("ip", "-n", ns, "link", "set", here, "up")
        yield names
    finally:
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def start(ns: str, args: list[str], log: Path, *, hide: Path | None = None) -> subprocess.Popen:
    """`python -m launch.cli ARGS` inside network namespace `ns` (and with `hide` covered by an
    empty tmpfs in a private mount namespace), in its own process group."""
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": repo}
    command = [sys.executable, "-m", "launch.cli", *args]
    if hide is not None:
        script = f'mount -t tmpfs none "{hide}" && exec "$@"'
        command = ["unshare", "--mount", "sh", "-c", script, "sh", *command]
    with open(log, "ab") as out:
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, *command],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip


@pytest.mark.timeout(240)
def test_a_producer_relays_snapshots_to_a_producer_on_another_host(tmp_path, hosts):
    run_dir = tmp_path / "run"
    sets = [
        "train.simulate_step_s=0.3", "sampling.group_size=4", "train.prompts_per_step=2",
        "net.control_port=0", "net.heartbeat_s=0.2", "snapshot.fanout=1",
        "staleness.max_staleness=1",
    ]  # fmt: skip
    args = ["consumer", "--run-dir", str(run_dir), "--steps", str(STEPS), "--bind", "10.77.0.1"]
    args += ["--insecure", *(x for s in sets for x in ("--set", s))]
    consumer = start(hosts["c"], args, tmp_path / "consumer.log")
    procs = [consumer]
    try:
        path = run_dir / RF.ENDPOINTS
        wait_for(path.exists, timeout_s=120, what="the consumer's endpoints", procs=procs)
        endpoint = RF.read_endpoints(path).control
        assert endpoint.startswith("tcp://10.77.0.1:")
        for i, name in enumerate("ab", start=2):
            args = [
                "producer", "--connect", endpoint, "--engine", "fake", "--id", name, "--insecure",
                "--set", "fake.latency_s=0.05", "--set", "net.heartbeat_s=0.2",
                "--set", f'producer.relay_host="10.77.0.{i}"',
            ]  # fmt: skip
            procs.append(start(hosts[name], args, tmp_path / f"{name}.log", hide=run_dir))
        wait_for(
            lambda: consumer.poll() is not None, timeout_s=200, what="the run to end", procs=[]
        )
        assert consumer.returncode == 0
        for p in procs[1:]:
            p.wait(60)
    finally:
        stop(*procs)
    counters = RF.read_ledger(run_dir).counters
    logs = {n: (tmp_path / f"{n}.log").read_text() for n in "ab"}
    assert "shared-filesystem" not in "".join(logs.values())  # the run dir was hidden from them
    assert counters.get("fetch_from_relay", 0) >= 1, counters
    assert counters.get("fetch_from_consumer", 0) >= 1, counters
    assert not [k for k in counters if k.startswith("fetch_bad_source")], counters
    assert counters.get("fetch_failed", 0) == 0, counters
    assert counters["chunk_bytes_served"] > 0
