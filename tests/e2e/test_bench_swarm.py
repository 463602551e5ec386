"""bench/swarm.py: its ratio and quantiles, its arguments, and a short real run of a few
producers in one process against a real consumer."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "producers", "window_s", "steps", "trained_groups_per_s", "tokens_per_s", "lease_requests",
    "lease_p50_s", "lease_p99_s", "heartbeat_p99_s", "control_timeouts", "registration_s",
    "register_p99_s", "consumer_cpu", "consumer_rss_mib", "consumer_rss_peak_mib",
    "empty_lease_replies_per_s", "empty_lease_replies_per_producer_s", "metrics_line_bytes",
    "consumer_ok", "producers_unfinished", "queued_mib_peak", "holds", "hold_s_max",
    "n", "client_cpu", "stats_window_s", "groups_per_s", "consumer_cpu_s_per_group",
    "consumer_cpu_s_per_heartbeat", "heartbeats_per_s", "lease_requests_timed",
    "lease_requests_parked", "lease_service_p50_ms", "lease_service_p99_ms",
    "network_loop_gap_max_ms", "network_loop_gap_p999_ms", "network_loop_gap_cpu_max_ms",
    "control_messages_per_s", "consumer_cpu_s_per_message", "lease_parked_grant_p99_ms",
    "lease_parked_grants", "control_timeouts_by_kind", "offered_groups_per_s",
}  # fmt: skip


def bench_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("swarm", ROOT / "bench" / "swarm.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_ratio_is_the_largest_n_over_64_and_null_without_64():
    swarm = bench_module()
    runs = [
        {"producers": 1, "trained_groups_per_s": 500.0, "consumer_cpu_s_per_group": 1e-3},
        {"producers": 64, "trained_groups_per_s": 400.0, "consumer_cpu_s_per_group": 2e-3},
        {"producers": 256, "trained_groups_per_s": 300.0, "consumer_cpu_s_per_group": 3e-3},
    ]
    assert swarm.summarise(runs) == {
        "largest_producers": 256,
        "ratio_groups_per_s_largest_vs_64": pytest.approx(0.75),
        "ratio_cpu_per_group_largest_vs_64": pytest.approx(1.5),
    }
    assert swarm.summarise(runs[:1])["ratio_groups_per_s_largest_vs_64"] is None
    assert swarm.summarise(runs[:1])["ratio_cpu_per_group_largest_vs_64"] is None
    assert swarm.quantile([], 0.5) is None
    assert swarm.quantile([3.0, 1.0, 2.0, 4.0], 0.5) == 3.0
    assert swarm.quantile([float(i) for i in range(100)], 0.99) == 99.0


def test_an_offered_load_sets_the_same_throughput_at_every_n():
    """R groups/s from the groups in flight at once: N x in-flight, at most the open leases
    ((max_staleness + 1) x prompts_per_step = 256 by default)."""
    swarm = bench_module()
    a = swarm.parser().parse_args(["--offered-groups-per-s", "40"])
    assert swarm.latency_s(64, a) == pytest.approx(64 / 40)
    assert swarm.latency_s(1024, a) == pytest.approx(256 / 40)
    b = swarm.parser().parse_args(["--latency-s", "0.5"])
    assert swarm.latency_s(1024, b) == 0.5


def test_a_producer_count_out_of_range_is_refused():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "swarm.py"), "--producers", "0,2000"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert "within 1..1024" in out.stderr


@pytest.mark.timeout(180)
def test_a_few_producers_against_a_real_consumer(tmp_path):
    path = tmp_path / "swarm.json"
    args = ["--producers", "2,3", "--seconds", "2", "--warmup-s", "0.5", "--json", str(path),
            "--offered-groups-per-s", "1000", "--match-delivered"]  # fmt: skip
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "swarm.py"), *args],
        capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    res = json.loads(path.read_text())
    assert res["bench"] == "swarm"
    assert res["largest_producers"] == 3
    assert res["ratio_groups_per_s_largest_vs_64"] is None
    assert res["ratio_cpu_per_group_largest_vs_64"] is None
    two, run = res["runs"]  # in the order asked for, the largest measured first
    assert (two["n"], run["n"]) == (2, 3)
    assert run["offered_groups_per_s"] == 1000
    assert two["offered_groups_per_s"] == run["groups_per_s"]  # offered what 3 delivered
    assert set(run) == KEYS
    assert run["producers"] == 3
    assert run["consumer_ok"] is True  # the ledger balanced and the consumer exited 0
    assert run["producers_unfinished"] == 0  # every producer heard the end of the run
    assert run["trained_groups_per_s"] > 0
    assert run["tokens_per_s"] > 0
    assert run["lease_requests"] > 0
    assert run["lease_p50_s"] <= run["lease_p99_s"]
    assert run["consumer_rss_mib"] > 0
    assert run["consumer_rss_peak_mib"] >= run["consumer_rss_mib"]
    assert 0 < run["queued_mib_peak"] <= 256  # net.max_queued_mib
    assert out.stdout.index("N=    3") < out.stdout.index("N=    2")
    # measured inside the consumer (netstats.json)
    assert run["n"] == 3
    assert run["groups_per_s"] > 0
    assert run["consumer_cpu_s_per_group"] > 0
    assert run["lease_requests_timed"] > 0
    assert 0 < run["lease_service_p50_ms"] <= run["lease_service_p99_ms"]
    assert run["network_loop_gap_max_ms"] > 0
    assert run["client_cpu"] > 0
