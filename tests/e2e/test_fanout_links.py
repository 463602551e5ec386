"""bench/fanout.py --link-mbit: one snapshot to producers in their own network namespaces, every
link capped with tc tbf, relays off and on (bench/fanout_links.py). Every copy must equal the
consumer's file; without relays the consumer sends one copy per producer, with relays one (a
chain of relays, each serving the chunks it has while it fetches the rest);
the cap is in force (one producer alone cannot beat its link). Needs root, iproute2 and the
tbf qdisc; slow (real processes in namespaces, ~40 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from netns import Hosts, unavailable

ROOT = Path(__file__).resolve().parents[2]
MBIT, MIB, N = 80.0, 4, 4


def _why_not() -> str:
    why = unavailable()
    if why:
        return why
    with Hosts(["x"]) as hosts:
        err = hosts.limit("x", MBIT)
    return f"tc tbf: {err}" if err else ""


pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(600)
def test_relays_cut_the_consumers_egress_under_capped_links(tmp_path):
    why = _why_not()
    if why:
        pytest.skip(why)
    path = tmp_path / "links.json"
    args = ["--link-mbit", str(MBIT), "--mib", str(MIB), "--fetchers", str(N), "--fanout", "1",
            "--json", str(path)]  # fmt: skip
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fanout.py"), *args],
        capture_output=True, text=True, timeout=580,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    res = json.loads(path.read_text())
    assert res["link_mbit"] == MBIT
    size_bits = MIB * (1 << 20) * 8
    assert res["one_producer_s"] >= size_bits / (MBIT * 1e6)  # the link is the cap
    off, on = res["relays_off"], res["relays_on"]
    for r in (off, on, res["one_producer"]):
        assert r["verified"] == r["producers"]  # every copy equals the consumer's file
    assert off["from_relay"] == 0
    assert off["consumer_egress_copies"] == pytest.approx(N, abs=0.01)
    assert on["from_relay"] >= 1
    assert on["consumer_egress_copies"] <= N - on["from_relay"] + 0.01
    # relays stream what they fetch: the consumer's plans make a chain, it sends one copy
    assert on["from_relay"] == N - 1
    assert on["consumer_egress_copies"] == pytest.approx(1, abs=0.01)
    for key in ("per_producer_s_p50", "consumer_egress_copies", "cpu_busy", "over_one_p50"):
        assert key in off
        assert key in on
