"""Is the control plane flat in the number of producers? N producers in one process against a
real consumer, for several N, with the largest N's throughput as a ratio of the one at 64.

    python bench/swarm.py [--producers 1,64,256,1024] [--seconds 15] [--json PATH]
    python bench/swarm.py --producers 1024 --group-size 16 --tokens 8192   # 1 MiB groups

- consumer: `asyncgrpo consumer` in its own process with a simulated learner step
  (`train.simulate_step_s`, 1 ms by default: no model), real sockets, leases, ledger, a small
  snapshot published every step.
- producers: N copies of the project's own `Producer` (`producer/worker.py`: registration,
  heartbeats, lease loop, weight reloads, outbox) with the fake engine, all in this process on
  one event loop and one ZeroMQ context (groups of G x T tokens, generated at once unless
  `--latency-s`).

Each N is measured over a window of `--seconds` that starts `--warmup-s` after the last
producer registered; then the consumer is stopped (SIGINT: final snapshot, ledger checked,
producers told) and must exit 0. Reported per N (JSON keys in brackets):
- trained groups/s and completion tokens/s from the consumer's metrics.jsonl
  [`trained_groups_per_s`, `tokens_per_s`];
- lease request round trips seen by the producers, p50/p99 [`lease_p50_s`, `lease_p99_s`],
  heartbeat round trips [`heartbeat_p99_s`], requests that got no reply within the producer's
  timeout [`control_timeouts`, and by message kind `control_timeouts_by_kind`];
- registration: from starting the producers to the last one registered [`registration_s`],
  and the p99 of one registration's round trip [`register_p99_s`];
- the consumer's CPU (user + system seconds per second of the window: 1.0 = one core busy)
  [`consumer_cpu`], its resident memory at the end of the window and its peak
  [`consumer_rss_mib`, `consumer_rss_peak_mib`];
- lease replies that granted nothing, per second and per producer per second
  [`empty_lease_replies_per_s`, `empty_lease_replies_per_producer_s`];
- the mean size of a metrics.jsonl line [`metrics_line_bytes`] and whether the ledger balanced
  and the consumer exited 0 [`consumer_ok`];
- backpressure over the whole run (ledger.json's `admission`; null for a consumer without it):
  the most MiB of groups queued for the learner at once [`queued_mib_peak`], times producers
  were told to hold a group [`holds`] and the longest hold [`hold_s_max`].
- measured inside the consumer (its netstats.json, common/files/net_stats.py, read at both ends of
  the window), so the swarm's own delays are not in them: trained groups/s [`groups_per_s`],
  the consumer's CPU seconds per trained group and per heartbeat [`consumer_cpu_s_per_group`,
  `consumer_cpu_s_per_heartbeat`], lease requests from off the socket to reply sent, p50/p99
  [`lease_service_p50_ms`, `lease_service_p99_ms`; parked ones, waiting for leases to free up,
  counted in `lease_requests_parked`; those granted when leases freed up, from the start of
  the loop's turn that freed them to the reply, `lease_parked_grant_p99_ms`], the longest
  stretch in which the network thread read no socket [`network_loop_gap_max_ms`: wall clock,
  with whatever preempted it; `network_loop_gap_cpu_max_ms`: the longest in the thread's own
  CPU time], control
  messages per second and the consumer's CPU per message [`control_messages_per_s`,
  `consumer_cpu_s_per_message`; heartbeats [`heartbeats_per_s`] stay within
  `net.max_heartbeats_per_s` whatever N (common/net/heartbeat.py), lease polls likewise]; and
  the swarm's own CPU, in cores [`client_cpu`], so the reader sees which side is the limit.
`n` is N again.
The consumer is pinned to core `--consumer-core` (0 by default on a machine of 2 or more cores)
and this process to the others. The consumer's run directory and the producers' snapshot caches
live under `--tmp-dir` (/dev/shm by default: in memory). Every producer pins every snapshot
(a directory and a hard link, producer/weights.py); a real one does that once per snapshot on
its own host, but 1,024 simulated ones on one core and an ext4 journal took seconds per
snapshot, and the leases granted at a step waited for them (at 1,024, offered 40 groups/s:
24-31 delivered on disk, 32 in memory).
Top level: `ratio_groups_per_s_largest_vs_64` (trained groups/s at the largest N over the figure
at 64, the same run; null when 64 is not among the Ns), `ratio_cpu_per_group_largest_vs_64`
(the consumer's CPU per trained group likewise), `largest_producers`, the machine's load
average before and after (`load_1m_start`, `load_1m_end`) and the settings. This process runs
the producers on the same machine as the consumer, so on a small machine the figures at large N
include the cost of simulating the swarm: its one core delivers fewer groups per second at
1,024 than at 64, and the consumer's per-second costs then weigh on fewer groups.
`--offered-groups-per-s R` offers the same load at every N instead (each producer's generation
time set so that its groups in flight finish R per second in all), which compares the
consumer's CPU per group at equal offered load. On one small machine the swarm itself may not
deliver it at 1,024 (it pins every snapshot 1,024 times on one core, and a step's new leases
wait for their producer's pin), so `--match-delivered` runs the largest N first and offers the
others what it delivered: the consumer's CPU per group at equal throughput. Each run's
`offered_groups_per_s` says what it was offered.

    python bench/swarm.py --producers 64,1024 --offered-groups-per-s 40 --json PATH
    python bench/swarm.py --producers 64,1024 --offered-groups-per-s 40 --match-delivered
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import config as C
from common import wire
from common.files import run_files as RF
from common.files.metrics import read_steps
from common.files.net_stats import NetStats, read_net_stats
from producer.main import run as run_producer
from producer.worker import Producer

BASELINE_N = 64
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Probe:
    """What the producers saw, with the monotonic time of each observation."""

    lease: list[tuple[float, float]] = field(default_factory=list)  # (at, round trip s)
    heartbeat: list[tuple[float, float]] = field(default_factory=list)
    register: list[float] = field(default_factory=list)  # round trip s of each registration
    registered: dict[str, float] = field(default_factory=dict)  # producer -> first Welcome at
    empty: list[float] = field(default_factory=list)  # when a lease reply granted nothing
    timeouts: list[tuple[float, str]] = field(default_factory=list)  # (at, message kind)


def instrument(producer: Producer, probe: Probe) -> None:
    """Time `producer`'s control requests (its own client, wrapped: nothing else changes)."""
    request = producer.control.request
    pid = producer.state.producer_id

    async def timed(msg: wire.Message, *, timeout_s: float) -> wire.Message:
        t0 = time.monotonic()
        try:
            reply = await request(msg, timeout_s=timeout_s)
        except TimeoutError:
            probe.timeouts.append((time.monotonic(), msg.KIND))
            raise
        t1 = time.monotonic()
        if isinstance(msg, wire.LeaseRequest):
            probe.lease.append((t1, t1 - t0))
            if isinstance(reply, wire.LeaseGrant) and not reply.leases:
                probe.empty.append(t1)
        elif isinstance(msg, wire.Heartbeat):
            probe.heartbeat.append((t1, t1 - t0))
        elif isinstance(msg, wire.Register):
            probe.register.append(t1 - t0)
            probe.registered.setdefault(pid, t1)
        return reply

    setattr(producer.control, "request", timed)  # noqa: B010 (an instance's method, wrapped)


def quantile(values: list[float], q: float) -> float | None:
    """The `q` quantile (nearest rank) of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def proc_mem_mib(pid: int) -> tuple[float, float]:
    """(resident, peak resident) MiB of process `pid` (Linux /proc)."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def consumer_args(run: Path, prompts: Path, a: argparse.Namespace) -> list[str]:
    sets = [
        f"train.simulate_step_s={a.step_s}", f"train.prompts_per_step={a.prompts_per_step}",
        f"sampling.group_size={a.group_size}", f"sampling.max_new_tokens={a.tokens}",
        f"staleness.max_staleness={a.max_staleness}", "train.drop_zero_variance=false",
        "task.source=jsonl", f"task.path={prompts}", "net.control_port=0",
        f"net.max_message_mib={a.max_message_mib}", f"net.heartbeat_s={a.heartbeat_s}",
        f"net.producer_timeout_s={max(30.0, 3 * a.heartbeat_s)}", *a.set,
    ]  # fmt: skip
    steps = str(a.steps)
    args = [sys.executable, "-m", "launch.cli", "consumer", "--run-dir", str(run), "--steps", steps]
    for s in sets:
        args += ["--set", s]
    return args


def latency_s(n: int, a: argparse.Namespace) -> float:
    """Each producer's fake generation time per group: `--latency-s`, or with
    `--offered-groups-per-s R` the time that makes the groups in flight at once (N x
    `--in-flight`, at most the leases the consumer keeps open) finish R groups per second."""
    if not a.offered_groups_per_s:
        return float(a.latency_s)
    open_leases = (a.max_staleness + 1) * a.prompts_per_step
    return float(min(n * a.in_flight, open_leases) / a.offered_groups_per_s)


def producer_config(endpoint: str, i: int, a: argparse.Namespace, n: int) -> C.Config:
    return C.override(
        C.Config(),
        {
            "net.connect": endpoint, "producer.id": f"swarm-{i:04d}",
            "producer.engine": "fake", "producer.max_in_flight": a.in_flight,
            "fake.min_tokens": a.tokens, "fake.max_tokens": a.tokens,
            "fake.latency_s": latency_s(n, a), "net.max_message_mib": a.max_message_mib,
            "net.heartbeat_s": a.heartbeat_s,
            "net.producer_timeout_s": max(30.0, 3 * a.heartbeat_s),
            "run.seed": i,
        },
    )  # fmt: skip


async def run_producers(
    n: int, endpoint: str, a: argparse.Namespace, *, timeout_s: float
) -> list[int]:
    """Run `n` producers against the consumer at `endpoint` until its run ends (it stops after
    `--steps`); their exit codes. Raises TimeoutError after `timeout_s`."""
    ctx = zmq.asyncio.Context()
    ctx.set(zmq.MAX_SOCKETS, max(1024, 8 * n))
    producers = [Producer(producer_config(endpoint, i, a, n), ctx) for i in range(n)]
    try:
        async with asyncio.timeout(timeout_s):
            return list(await asyncio.gather(*(run_producer(p) for p in producers)))
    finally:
        ctx.destroy(linger=0)


def throughput(run: Path, unix_a: float, unix_b: float) -> tuple[list[Any], float, float]:
    """The metrics lines of `run` within [unix_a, unix_b], and from them the trained groups and
    completion tokens per second (0 with fewer than two lines)."""
    steps = [r for r in read_steps(run / RF.METRICS) if unix_a <= r.unix_time <= unix_b]
    if len(steps) < 2:
        return steps, 0.0, 0.0
    wall = steps[-1].unix_time - steps[0].unix_time
    trained = (steps[-1].groups_trained - steps[0].groups_trained) / wall
    return steps, trained, sum(r.num_completion_tokens for r in steps[1:]) / wall


async def swarm(
    n: int, run: Path, consumer: subprocess.Popen[bytes], a: argparse.Namespace
) -> dict[str, Any]:
    """Run `n` producers against the consumer at `run`; the figures of one window."""
    while not (run / RF.ENDPOINTS).exists():
        if consumer.poll() is not None:
            raise RuntimeError(f"the consumer exited with {consumer.returncode} before listening")
        await asyncio.sleep(0.05)
    endpoint = RF.read_endpoints(run / RF.ENDPOINTS).control
    ctx = zmq.asyncio.Context()
    ctx.set(zmq.MAX_SOCKETS, max(1024, 8 * n))
    probe = Probe()
    producers = [Producer(producer_config(endpoint, i, a, n), ctx) for i in range(n)]
    for p in producers:
        instrument(p, probe)
    t_start = time.monotonic()
    tasks = [asyncio.create_task(run_producer(p), name=p.state.producer_id) for p in producers]
    try:
        while len(probe.registered) < n:
            if all(t.done() for t in tasks) or time.monotonic() - t_start > a.register_timeout_s:
                raise RuntimeError(f"only {len(probe.registered)} of {n} producers registered")
            await asyncio.sleep(0.05)
        registration_s = max(probe.registered.values()) - t_start
        await asyncio.sleep(a.warmup_s)
        t_a, unix_a, cpu_a = time.monotonic(), time.time(), proc_cpu_s(consumer.pid)
        client_a, stats_a = client_cpu_s(), await stats_since(run, unix_a)
        await asyncio.sleep(a.seconds)
        t_b, unix_b, cpu_b = time.monotonic(), time.time(), proc_cpu_s(consumer.pid)
        client_b, stats_b = client_cpu_s(), await stats_since(run, unix_b)
        rss, peak = proc_mem_mib(consumer.pid)
        consumer.send_signal(signal.SIGINT)  # final snapshot, ledger checked, producers told
        _, pending = await asyncio.wait(tasks, timeout=a.stop_timeout_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.destroy(linger=0)
    code = await asyncio.to_thread(consumer.wait, 120)
    span = t_b - t_a

    def within(stamps: list[tuple[float, float]]) -> list[float]:
        return [v for at, v in stamps if t_a <= at <= t_b]

    steps, trained, tokens = throughput(run, unix_a, unix_b)
    lines = (run / RF.METRICS).read_text().splitlines()
    ledger = RF.read_ledger(run)
    empty = sum(t_a <= at <= t_b for at in probe.empty) / span
    admission = ledger.admission or RF.BackpressureTotals()  # None: a consumer without it
    queued_peak = admission.queued_bytes_max
    return {
        "producers": n,
        "window_s": span,
        "steps": len(steps),
        "trained_groups_per_s": trained,
        "tokens_per_s": tokens,
        "lease_requests": len(within(probe.lease)),
        "lease_p50_s": quantile(within(probe.lease), 0.5),
        "lease_p99_s": quantile(within(probe.lease), 0.99),
        "heartbeat_p99_s": quantile(within(probe.heartbeat), 0.99),
        "control_timeouts": len(probe.timeouts),
        "control_timeouts_by_kind": dict(Counter(kind for _, kind in probe.timeouts)),
        "registration_s": registration_s,
        "register_p99_s": quantile(probe.register, 0.99),
        "consumer_cpu": (cpu_b - cpu_a) / span,
        "consumer_rss_mib": rss,
        "consumer_rss_peak_mib": peak,
        "empty_lease_replies_per_s": empty,
        "empty_lease_replies_per_producer_s": empty / n,
        "metrics_line_bytes": sum(map(len, lines)) / max(len(lines), 1),
        "consumer_ok": code == 0 and bool(ledger.balance.ok),
        "producers_unfinished": len(pending),
        "queued_mib_peak": None if queued_peak is None else queued_peak / (1 << 20),
        "holds": admission.holds,
        "hold_s_max": admission.hold_s_max,
        "client_cpu": (client_b - client_a) / span,
        **inside(stats_a, stats_b),
    }


def client_cpu_s() -> float:
    """User + system CPU seconds of this process (the swarm) so far."""
    t = os.times()
    return t.user + t.system


async def stats_since(run: Path, unix: float, timeout_s: float = 15.0) -> NetStats | None:
    """The first netstats.json the consumer writes at or after `unix` (it rewrites it with its
    books, about every 2 s); None if none comes within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = read_net_stats(run)
        if stats is not None and stats.unix_time >= unix:
            return stats
        await asyncio.sleep(0.05)
    return None


def inside(a: NetStats | None, b: NetStats | None) -> dict[str, Any]:
    """The consumer's own figures between two of its netstats.json (common/files/net_stats.py): CPU
    per trained group and per heartbeat, lease service time and the longest gap in reading."""
    if a is None or b is None or b.unix_time <= a.unix_time:
        raise RuntimeError("the consumer wrote no netstats.json during the window")
    cpu, groups, beats = (
        b.process_cpu_s - a.process_cpu_s,
        b.groups_trained - a.groups_trained,
        (b.heartbeats - a.heartbeats),
    )
    service, busy = b.lease_service.minus(a.lease_service), b.loop_gap.minus(a.loop_gap)
    parked = b.lease_parked_grant.minus(a.lease_parked_grant)
    busy_cpu, messages = (
        b.loop_gap_cpu.minus(a.loop_gap_cpu),
        b.control_messages - (a.control_messages),
    )

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else seconds * 1e3

    return {
        "stats_window_s": b.unix_time - a.unix_time,
        "groups_per_s": groups / (b.unix_time - a.unix_time),
        "consumer_cpu_s_per_group": cpu / groups if groups else None,
        "consumer_cpu_s_per_heartbeat": cpu / beats if beats else None,
        "heartbeats_per_s": beats / (b.unix_time - a.unix_time),
        "lease_requests_timed": service.total(),
        "lease_requests_parked": b.lease_parked - a.lease_parked,
        "lease_service_p50_ms": ms(service.quantile(0.5)),
        "lease_service_p99_ms": ms(service.quantile(0.99)),
        "lease_parked_grant_p99_ms": ms(parked.quantile(0.99)),
        "lease_parked_grants": parked.total(),
        "network_loop_gap_max_ms": ms(busy.max()),
        "network_loop_gap_p999_ms": ms(busy.quantile(0.999)),
        "network_loop_gap_cpu_max_ms": ms(busy_cpu.max()),
        "control_messages_per_s": messages / (b.unix_time - a.unix_time),
        "consumer_cpu_s_per_message": cpu / messages if messages else None,
    }


def measure(n: int, a: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="swarm-") as tmp:
        run, prompts = Path(tmp) / "run", Path(tmp) / "prompts.jsonl"
        prompts.write_text(
            "".join(json.dumps({"prompt": f"p{i}", "answer": "a"}) + "\n" for i in range(4096))
        )
        log = open(Path(tmp) / "consumer.log", "wb")  # noqa: SIM115 (closed below)
        pin = ["taskset", "-c", str(a.consumer_core)] if a.consumer_core >= 0 else []
        consumer = subprocess.Popen(pin + consumer_args(run, prompts, a), stdout=log, stderr=log)
        try:
            offered = a.offered_groups_per_s or None
            result = asyncio.run(swarm(n, run, consumer, a))
            return {"n": n, "offered_groups_per_s": offered, **result}
        except BaseException:
            consumer.kill()
            consumer.wait()
            log.close()
            sys.stderr.write((Path(tmp) / "consumer.log").read_text()[-4000:])
            raise
        finally:
            log.close()


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by_n = {r["producers"]: r for r in runs}
    largest = max(by_n)
    base = by_n.get(BASELINE_N)
    ratio = None
    if base is not None and base["trained_groups_per_s"] > 0:
        ratio = by_n[largest]["trained_groups_per_s"] / base["trained_groups_per_s"]
    cpu = None
    if base is not None and base.get("consumer_cpu_s_per_group"):
        largest_cpu = by_n[largest].get("consumer_cpu_s_per_group")
        cpu = None if largest_cpu is None else largest_cpu / base["consumer_cpu_s_per_group"]
    return {
        "largest_producers": largest,
        "ratio_groups_per_s_largest_vs_64": ratio,
        "ratio_cpu_per_group_largest_vs_64": cpu,
    }


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--producers", default="1,64,256,1024", help="comma-separated Ns (1-1024)")
    ap.add_argument("--seconds", type=float, default=15.0, help="measured window per N")
    ap.add_argument("--warmup-s", type=float, default=3.0, help="after the last registration")
    ap.add_argument("--step-s", type=float, default=0.001, help="simulated learner step")
    ap.add_argument("--prompts-per-step", type=int, default=64)
    ap.add_argument("--max-staleness", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64, help="completion tokens per sample")
    ap.add_argument("--in-flight", type=int, default=1, help="leases per producer")
    ap.add_argument("--latency-s", type=float, default=0.0, help="fake generation per group")
    ap.add_argument(
        "--offered-groups-per-s", type=float, default=0.0, metavar="R",
        help="the same offered load at every N: each producer's generation time set so that "
        "the groups in flight finish R groups/s (0: as fast as the swarm can; overrides "
        "--latency-s)",
    )  # fmt: skip
    ap.add_argument(
        "--match-delivered", action="store_true",
        help="with --offered-groups-per-s: run the largest N first, then offer the others the "
        "groups/s it delivered (the consumer's CPU per group compared at equal throughput)",
    )  # fmt: skip
    ap.add_argument("--heartbeat-s", type=float, default=1.0, help="net.heartbeat_s (floor)")
    ap.add_argument("--max-message-mib", type=float, default=64.0)
    ap.add_argument("--register-timeout-s", type=float, default=120.0)
    ap.add_argument("--stop-timeout-s", type=float, default=60.0)
    ap.add_argument(
        "--consumer-core", type=int, default=0 if (os.cpu_count() or 1) > 1 else -1,
        help="pin the consumer to this core and the swarm to the others (-1: no pinning)",
    )  # fmt: skip
    ap.add_argument(
        "--tmp-dir", default="/dev/shm" if Path("/dev/shm").is_dir() else None,
        help="the consumer's run dir and the producers' snapshot caches (default: /dev/shm, "
        "memory: 1,024 simulated producers pinning every snapshot do not wait on a disk)",
    )  # fmt: skip
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="another consumer setting, e.g. net.max_queued_mib=512 (repeatable)",
    )  # fmt: skip
    ap.add_argument("--steps", type=int, default=0, help="consumer steps (0 = until stopped)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    ns = [int(x) for x in a.producers.split(",") if x.strip()]
    if not ns or any(not 1 <= n <= 1024 for n in ns):
        ap.error("--producers: each N must be within 1..1024")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16 * max(ns) + 1024)), hard))
    if a.consumer_core >= 0:  # the swarm on the other cores
        others = set(os.sched_getaffinity(0)) - {a.consumer_core}
        if others:
            os.sched_setaffinity(0, others)
    if a.tmp_dir:  # the consumer's run dir (measure) and every Weights cache (mkdtemp)
        tempfile.tempdir = a.tmp_dir
    load_start = os.getloadavg()[0]
    done = {}
    for n in sorted(ns, reverse=True) if a.match_delivered else ns:
        r = done[n] = measure(n, a)
        if a.match_delivered and n == max(ns):  # the others are offered what it delivered
            a.offered_groups_per_s = r["groups_per_s"]
        p50, p99 = r["lease_p50_s"], r["lease_p99_s"]
        print(
            f"N={n:5d}  trained {r['trained_groups_per_s']:8.1f} groups/s "
            f"{r['tokens_per_s']:10.0f} tok/s  lease p50/p99 "
            f"{(p50 or 0) * 1e3:7.1f}/{(p99 or 0) * 1e3:7.1f} ms  "
            f"reg {r['registration_s']:6.2f} s  cpu {r['consumer_cpu']:4.2f}  "
            f"rss {r['consumer_rss_mib']:7.1f} MiB  empty {r['empty_lease_replies_per_s']:8.1f}/s"
            f"  line {r['metrics_line_bytes']:8.0f} B  timeouts {r['control_timeouts']}"
            f"  ok {r['consumer_ok']}  peak rss {r['consumer_rss_peak_mib']:.0f} MiB"
            f"  queued peak {r['queued_mib_peak'] or 0:.1f} MiB  holds {r['holds']}",
            flush=True,
        )
        print(
            f"        inside the consumer: {r['groups_per_s']:7.1f} groups/s  cpu/group "
            f"{(r['consumer_cpu_s_per_group'] or 0) * 1e3:6.3f} ms  cpu/heartbeat "
            f"{(r['consumer_cpu_s_per_heartbeat'] or 0) * 1e3:6.3f} ms  lease service p50/p99 "
            f"{r['lease_service_p50_ms'] or 0:6.3f}/{r['lease_service_p99_ms'] or 0:6.3f} ms "
            f"(parked, granted: p99 {r['lease_parked_grant_p99_ms'] or 0:6.3f} ms)  "
            f"longest gap {r['network_loop_gap_max_ms'] or 0:6.2f} ms "
            f"({r['network_loop_gap_cpu_max_ms'] or 0:6.2f} ms of its CPU)  "
            f"{r['control_messages_per_s']:6.0f} control msgs/s, cpu/msg "
            f"{(r['consumer_cpu_s_per_message'] or 0) * 1e3:6.3f} ms  "
            f"client cpu {r['client_cpu']:4.2f}",
            flush=True,
        )
    runs = [done[n] for n in ns]
    out = {
        "bench": "swarm",
        "load_1m_start": load_start,
        "load_1m_end": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
        "settings": {k: v for k, v in vars(a).items() if k != "json"},
        "runs": runs,
        **summarise(runs),
    }
    ratio = out["ratio_groups_per_s_largest_vs_64"]
    if ratio is not None:
        print(f"ratio trained groups/s N={out['largest_producers']} vs N={BASELINE_N}: {ratio:.3f}")
    cpu_ratio = out["ratio_cpu_per_group_largest_vs_64"]
    if cpu_ratio is not None:
        print(f"ratio consumer CPU per group N={out['largest_producers']} vs N={BASELINE_N}: "
              f"{cpu_ratio:.3f}")  # fmt: skip
    print(f"load average (1 min): {load_start:.1f} before, {out['load_1m_end']:.1f} after")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, sort_keys=True))
    return 0 if all(r["consumer_ok"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
