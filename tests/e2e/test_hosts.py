"""Several hosts: a consumer on host a (CurveZMQ keys, bound to its own address) and producers
on hosts b and c, each a network namespace joined by veth pairs (tests/netns.py). The
producers run in their own directories with the consumer's directory hidden from them (their
own mount namespace): nothing is shared but the TCP sockets.

One run shows, in order: groups flowing from both producers; snapshots fetched over the
network with their hash verified (a log line says so); a producer with a key the consumer does
not list refused, and the refusal logged on both sides; c's link cut (`ip link set down`) for
longer than the producer timeout, so its leases expire and are leased again to b; c rejoining
once the link is back; a clean stop with a balanced ledger, every producer exiting 0 within
seconds of the consumer and no group delivered twice (producers that fetch over the network once
dropped the status a fetch report's reply carried: its acks, and the end of the run, so they
re-sent acknowledged groups and ran on until net.consumer_timeout_s). A second run goes through
a link with `tc netem` delay 50 ms and 1% loss, where the kernel has netem.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import netns
import pytest
from ledger_invariant import assert_run_balanced
from procs import read_jsonl, wait_for

from common.files import run_files as RF
from common.net.keys import create_keys
from common.wire import OUTCOMES

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(netns.unavailable()), reason=netns.unavailable() or "available"),
]
CLI = [sys.executable, "-m", "launch.cli"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
END_S = 15  # a producer exits within this many seconds of the consumer (net.consumer_timeout_s
# is 300 s: one that missed the end would run on that long)


def _trained(run_dir: Path, producer: str) -> int:
    ledger = RF.latest_ledger(run_dir)
    return ledger.count(producer, "trained") if ledger is not None else 0


def _open(run_dir: Path, producer: str) -> int:
    """Leases `producer` holds that have not ended (issued, or delivered and not yet trained)."""
    ledger = RF.latest_ledger(run_dir)
    if ledger is None:
        return 0
    return ledger.count(producer, "issued") - sum(ledger.count(producer, o) for o in OUTCOMES)


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)


class Cluster:
    """Host a runs the consumer; `producer(host, name)` starts one on another host."""

    def __init__(self, hosts: netns.Hosts, tmp: Path, *sets: str) -> None:
        self.hosts, self.tmp = hosts, tmp
        self.keys = tmp / "a" / "keys"
        for host in ("a", "b", "c"):
            (tmp / host).mkdir()
        create_keys(self.keys, ["b", "c", "intruder"])
        (self.keys / "clients" / "intruder.key").unlink()  # a key the consumer does not list
        self.run_dir = tmp / "a" / "run"
        prompts = tmp / "a" / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                                   for i in range(200)))  # fmt: skip
        args = [
            "consumer", "--run-dir", str(self.run_dir), "--steps", "100000", "--keys",
            str(self.keys), "--bind", hosts.addr["a"], "--port", "0",
        ]  # fmt: skip
        for s in (
            "train.simulate_step_s=0.1", "sampling.group_size=4", "train.prompts_per_step=4",
            "staleness.max_staleness=4", "net.heartbeat_s=0.2", "net.producer_timeout_s=3",
            "net.resend_after_s=2", "task.source=jsonl", f"task.path={prompts}", *sets,
        ):  # fmt: skip
            args += ["--set", s]
        self.consumer = hosts.run("a", [*CLI, *args], log=tmp / "consumer.log", env=ENV,
                                  cwd=tmp / "a")  # fmt: skip
        self.procs = [self.consumer]
        path = self.run_dir / RF.ENDPOINTS
        wait_for(path.exists, timeout_s=120, what="the consumer listening", procs=self.procs)
        self.endpoint = RF.read_endpoints(path).control
        assert self.endpoint.startswith(f"tcp://{hosts.addr['a']}:")

    def producer(
        self, host: str, name: str, *, keys: str | None = None, latency_s: float = 0.05
    ) -> subprocess.Popen:
        home = self.tmp / host
        copy = home / f"keys-{name}"  # the host's own copy of its directory (docs/running.md)
        subprocess.run(["cp", "-r", str(self.keys / "producers" / (keys or name)), str(copy)],
                       check=True)  # fmt: skip
        args = [
            "producer", "--connect", self.endpoint, "--engine", "fake", "--id", name,
            "--keys", str(copy), "--set", f"fake.latency_s={latency_s}",
            "--set", "net.heartbeat_s=0.2",
        ]  # fmt: skip
        proc = self.hosts.run(host, [*CLI, *args], log=self.tmp / f"{name}.log", env=ENV,
                              cwd=home, hide=(self.tmp / "a",))  # fmt: skip
        self.procs.append(proc)
        return proc


@pytest.mark.timeout(600)
def test_three_hosts_train_refuse_a_stranger_survive_a_cut_link_and_stop_clean(tmp_path):
    with netns.Hosts(["a", "b", "c"]) as hosts:
        cluster = Cluster(hosts, tmp_path)
        run_dir, log = cluster.run_dir, tmp_path
        try:
            # c generates slowly, so that it holds leases whenever its link is cut
            b, c = cluster.producer("b", "b"), cluster.producer("c", "c", latency_s=0.3)
            both = lambda: _trained(run_dir, "b") > 4 and _trained(run_dir, "c") > 4  # noqa: E731
            wait_for(both, timeout_s=180, what="groups from both hosts", procs=cluster.procs[:1])
            for name in ("b", "c"):  # the consumer's files are not visible there
                said = _text(log / f"{name}.log")
                assert "fetched over the network" in said
                assert "BLAKE3 hash verified" in said
                fetched = [x for x in said.splitlines() if "fetched over the network" in x]
                assert all("loaded weights v" in x for x in fetched)  # one INFO line a step

            # a stranger's key is refused, and both sides say so
            t0 = time.monotonic()
            stranger = cluster.producer("b", "stranger", keys="intruder")
            assert stranger.wait(60) == 2
            refused_s = time.monotonic() - t0
            assert "refused this producer's CurveZMQ key" in _text(log / "stranger.log")
            line = f"refused a CurveZMQ connection from {hosts.addr['b']}"
            wait_for(lambda: line in _text(log / "consumer.log"), timeout_s=30,
                     what="the consumer's refusal")  # fmt: skip

            # c's link goes down for longer than the producer timeout: its leases expire and
            # are leased again (to b, the only producer left), then c comes back
            wait_for(lambda: _open(run_dir, "c") > 0, timeout_s=60, what="c holding leases")
            hosts.cut("c")
            wait_for(lambda: "producer c silent" in _text(log / "consumer.log"), timeout_s=60,
                     what="c declared gone")  # fmt: skip
            b_before = _trained(run_dir, "b")
            wait_for(lambda: _trained(run_dir, "b") > b_before + 8, timeout_s=120,
                     what="b training alone")  # fmt: skip
            c_before = _trained(run_dir, "c")
            hosts.mend("c")
            wait_for(lambda: _trained(run_dir, "c") > c_before, timeout_s=120,
                     what="c training again after the link came back", procs=[c])  # fmt: skip
            assert "registering again" in _text(log / "c.log")
            cluster.consumer.send_signal(signal.SIGINT)
            assert cluster.consumer.wait(60) == 0
            assert b.wait(END_S) == 0
            assert c.wait(END_S) == 0
        finally:
            _stop(*cluster.procs)
    ledger = assert_run_balanced(run_dir)
    leases = RF.read_leases(run_dir)
    expired = [r for r in leases if r.state == "expired" and r.producer_id == "c"
               and r.reason != "shutdown"]  # fmt: skip
    assert expired, "c's leases expired while its link was down"
    trained_by_b = {r.prompt_index for r in leases if r.state == "trained"
                    and r.producer_id == "b"}  # fmt: skip
    assert {r.prompt_index for r in expired} & trained_by_b, "no expired prompt went to b"
    assert "stranger" not in ledger.by_producer
    assert ledger.counters.get("groups_duplicate", 0) == 0, ledger.counters
    print(f"refusal reported on the producer {refused_s:.1f} s after it started")


@pytest.mark.timeout(600)
def test_a_run_over_a_delayed_lossy_link_completes_with_a_balanced_ledger(tmp_path):
    with netns.Hosts(["a", "b", "c"]) as hosts:
        for host in ("b", "c"):
            why = hosts.netem(host, "delay", "50ms", "loss", "1%")
            if why:
                pytest.skip(f"tc netem is not available here ({why}): sch_netem missing")
        cluster = Cluster(hosts, tmp_path, "net.producer_timeout_s=10")
        try:
            procs = [cluster.producer("b", "b"), cluster.producer("c", "c")]
            steps = 20
            wait_for(lambda: len(read_jsonl(cluster.run_dir / RF.METRICS)) >= steps
                     if (cluster.run_dir / RF.METRICS).exists() else False,
                     timeout_s=400, what=f"{steps} steps", procs=cluster.procs[:1])  # fmt: skip
            cluster.consumer.send_signal(signal.SIGINT)
            assert cluster.consumer.wait(120) == 0
            for p in procs:
                assert p.wait(END_S) == 0
        finally:
            _stop(*cluster.procs)
    ledger = assert_run_balanced(cluster.run_dir)
    assert ledger.counters.get("groups_duplicate", 0) == 0, ledger.counters
