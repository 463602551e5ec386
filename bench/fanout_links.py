"""Snapshot fan-out when the links, not the CPUs, are the limit: hosts as network namespaces,
every link capped with `tc ... tbf`, one snapshot to N producers with relays off and on.

    python bench/fanout.py --link-mbit 80 [--mib 8] [--fetchers 16] [--fanout 4] [--json PATH]

The consumer and each producer run in their own network namespace (tests/netns.py), joined by
veths to one bridge, each link capped at `--link-mbit` Mbit/s each way (the consumer's too).
The consumer is bench/fanout.py's (`--consumer`: the real server and data plane, a snapshot of
`--mib` MiB written by the real publisher) bound to its namespace's address; each producer is
a process of this file (`--fetch`) running the real `Fetcher` (and, relays on, a `Relay` on its
own address) that starts at a common wall-clock instant and fetches the snapshot over TCP,
every chunk checked against the plan's digests; afterwards this process hashes every copy
against the consumer's file.

Three runs, each with a fresh consumer: one producer alone; N producers with relays off (the
consumer serves everyone at once, fan-out unbounded); N with relays on (`snapshot.fanout` =
`--fanout`). JSON (`--json`): `link_mbit`, `one_producer_s`, and for `relays_off` and
`relays_on`: `per_producer_s_p50` / `_max` (from the common start to that producer's verified
file), `over_one_p50` (p50 over one producer alone), `consumer_egress_copies` (bytes the
consumer's data socket sent / snapshot size), `from_relay`, `verified` (copies equal to the
consumer's file), `cpu_busy` (CPU seconds of the consumer and every producer over the run's
wall time, in cores: well under the machine's cores means the links bound the transfer).

A relay serves each chunk of a file it fetches once it has checked it, and holds a request for
a chunk still on its way (producer/fetch/relay.py): with equal links the consumer's plans make
a chain, the consumer sends one copy, and a producer k hops down finishes about k chunk times
after one producer alone would (see docs/results.md).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from netns import Hosts, unavailable  # noqa: E402 (tests/netns.py: hosts as namespaces)

from common import wire  # noqa: E402

MAX_MESSAGE = 64 << 20


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_file(path: Path) -> None:
    """Until `path` exists (the bench's signals between processes are files)."""
    while not path.exists():
        time.sleep(0.01)


async def fetch_one(a: argparse.Namespace) -> None:
    """A producer's process (`--fetch`): register, start relaying if asked, fetch the snapshot
    at the wall-clock instant in `a.work/start`, write the result, relay until `a.work/stop`."""
    import zmq.asyncio

    from producer.control import ControlClient
    from producer.fetch.fetcher import Fetcher
    from producer.fetch.relay import Relay

    work, info = a.work, wire.SnapshotInfo(*json.loads(a.info))
    ctx = zmq.asyncio.Context()
    control = ControlClient(ctx, a.fetch, keys=None, max_message_bytes=MAX_MESSAGE)
    tasks = [asyncio.create_task(control.read_replies())]
    relay = None
    try:
        await control.request(
            wire.Register(0, a.name, "bench", os.getpid(), "fake", -1, ()), timeout_s=60
        )
        if a.relay_host:
            relay = Relay(ctx, host=a.relay_host, port=0, keys=None, insecure=True,
                          max_message_bytes=MAX_MESSAGE)  # fmt: skip
            tasks.append(asyncio.create_task(relay.serve()))

        async def report(msg: wire.Message) -> wire.Message:
            return await control.request(msg, timeout_s=300)

        fetcher = Fetcher(
            control, ctx, data_endpoint=a.data, producer_id=a.name, keys=None,
            max_message_bytes=MAX_MESSAGE, report=report, relay=relay, timeout_s=300,
            relay_timeout_s=120,
        )  # fmt: skip
        (work / f"{a.name}.ready").touch()
        await asyncio.to_thread(wait_file, work / "start")
        start = float((work / "start").read_text())
        await asyncio.sleep(max(0.0, start - time.time()))
        await fetcher.fetch(info, work / a.name, held=None)
        done = time.time() - start
        source = "relay" if fetcher.counters.get("chunks_from_relay") else "consumer"
        result = {"seconds": done, "source": source}
        (work / f"{a.name}.json").write_text(json.dumps(result))
        await asyncio.to_thread(wait_file, work / "stop")
    finally:
        for task in tasks:
            task.cancel()
        if relay is not None:
            relay.close()
        control.close()
        ctx.destroy(linger=0)


class Consumer:
    """bench/fanout.py's consumer process inside host "c" (its counters on request)."""

    def __init__(self, hosts: Hosts, run: Path, a: argparse.Namespace, *, fanout: int) -> None:
        argv = [sys.executable, str(ROOT / "bench" / "fanout.py"), "--consumer", str(run),
                "--fanout", str(fanout), "--mib", str(a.mib), "--chunk-mib", str(a.chunk_mib),
                "--bind", hosts.addr["c"]]  # fmt: skip
        self.proc = subprocess.Popen(
            hosts.argv("c", argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        first = self._line()
        self.ports: dict[str, int] = first["ports"]
        self.info = wire.SnapshotInfo(*first["info"])

    def _line(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the consumer process exited ({self.proc.wait()})")
        return json.loads(line)

    def served_bytes(self) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write("counters\n")
        self.proc.stdin.flush()
        return float(self._line().get("chunk_bytes_served", 0))

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def run_once(
    hosts: Hosts, root: Path, a: argparse.Namespace, n: int, *, relays: bool
) -> dict[str, Any]:
    """One snapshot to producers p0..p(n-1); their figures (see the module doc)."""
    consumer = Consumer(hosts, root / "run", a, fanout=a.fanout if relays else 1 << 20)
    work = Path(tempfile.mkdtemp(dir=root, prefix="fetch-"))
    procs: list[subprocess.Popen[bytes]] = []
    c_addr = hosts.addr["c"]
    try:
        info, ports = consumer.info, consumer.ports
        for i in range(n):
            name = f"p{i}"
            argv = [sys.executable, __file__, "--fetch", f"tcp://{c_addr}:{ports['control']}",
                    "--data", f"tcp://{c_addr}:{ports['data']}", "--name", name,
                    "--work", str(work), "--info", json.dumps(dataclasses.astuple(info)),
                    ]  # fmt: skip
            if relays:
                argv += ["--relay-host", hosts.addr[name]]
            procs.append(hosts.run(name, argv, log=work / f"{name}.log"))
        deadline = time.monotonic() + 120
        while not all((work / f"p{i}.ready").exists() for i in range(n)):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                raise RuntimeError(f"a producer did not start: see {work}/*.log")
            time.sleep(0.05)
        served0 = consumer.served_bytes()
        cpu0 = proc_cpu_s(consumer.proc.pid) + sum(proc_cpu_s(p.pid) for p in procs)
        start = time.time() + 0.5
        (work / "start.tmp").write_text(repr(start))
        (work / "start.tmp").replace(work / "start")  # whole: a producer never reads it empty
        deadline = time.monotonic() + a.timeout_s
        while not all((work / f"p{i}.json").exists() for i in range(n)):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                raise RuntimeError(f"a fetch failed or timed out:\n{_failures(work, procs)}")
            time.sleep(0.05)
        wall = time.time() - start
        cpu = proc_cpu_s(consumer.proc.pid) + sum(proc_cpu_s(p.pid) for p in procs) - cpu0
        served = consumer.served_bytes() - served0
        results = [json.loads((work / f"p{i}.json").read_text()) for i in range(n)]
        truth = _digest(root / "run" / "snapshots" / "v000000" / Path(info.path).name)
        verified = sum(_digest(work / f"p{i}" / Path(info.path).name) == truth for i in range(n))
    finally:
        (work / "stop").touch()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        consumer.stop()
    times = sorted(r["seconds"] for r in results)
    return {
        "producers": n,
        "per_producer_s_p50": statistics.median(times),
        "per_producer_s_max": times[-1],
        "wall_s": wall,
        "consumer_egress_copies": served / info.num_bytes,
        "from_relay": sum(r["source"] == "relay" for r in results),
        "verified": verified,
        "cpu_s": cpu,
        "cpu_busy": cpu / wall,
    }


def _failures(work: Path, procs: list[subprocess.Popen[bytes]]) -> str:
    """The end of the log of each producer that exited or has no result (the logs are
    removed with the run's directory)."""
    lines = []
    for i, p in enumerate(procs):
        if p.poll() is not None or not (work / f"p{i}.json").exists():
            log = (work / f"p{i}.log").read_text(errors="replace").splitlines()[-8:]
            lines += [f"p{i} (exit {p.returncode}):", *(f"  {line}" for line in log)]
    return "\n".join(lines[-60:])


def _digest(path: Path) -> str:
    h = hashlib.blake2b()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def run_links(a: argparse.Namespace) -> dict[str, Any]:
    """The three runs of the module doc under `a.link_mbit`; the JSON object."""
    why = unavailable()
    if why:
        raise SystemExit(f"bench/fanout.py --link-mbit: {why}")
    names = ["c", *(f"p{i}" for i in range(a.fetchers))]
    out: dict[str, Any] = {
        "link_mbit": a.link_mbit, "mib": a.mib, "chunk_mib": a.chunk_mib, "fanout": a.fanout,
        "producers": a.fetchers, "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
    }  # fmt: skip
    with Hosts(names) as hosts, tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        for name in names:
            err = hosts.limit(name, a.link_mbit)
            if err:
                raise SystemExit(f"bench/fanout.py --link-mbit: tc tbf refused: {err}")
        root = Path(tmp)
        one = run_once(hosts, root, a, 1, relays=False)
        out["one_producer_s"] = one["per_producer_s_p50"]
        out["one_producer"] = one
        for key, relays in (("relays_off", False), ("relays_on", True)):
            r = run_once(hosts, root, a, a.fetchers, relays=relays)
            r["over_one_p50"] = r["per_producer_s_p50"] / out["one_producer_s"]
            out[key] = r
            print(
                f"{key:10s} N={a.fetchers}: per producer p50 {r['per_producer_s_p50']:.2f} s "
                f"(x{r['over_one_p50']:.1f} one alone), max {r['per_producer_s_max']:.2f} s, "
                f"consumer sent {r['consumer_egress_copies']:.2f} copies, "
                f"{r['from_relay']} via relays, {r['verified']}/{a.fetchers} verified, "
                f"cpu {r['cpu_busy']:.2f} cores",
                flush=True,
            )
    out["load_avg_1m_end"] = os.getloadavg()[0]
    print(f"one producer alone: {out['one_producer_s']:.2f} s at {a.link_mbit} Mbit/s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="a producer's process of bench/fanout_links.py")
    ap.add_argument("--fetch", required=True, help="the consumer's control endpoint")
    ap.add_argument("--data", required=True, help="the consumer's data endpoint")
    ap.add_argument("--name", required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--info", required=True, help="the snapshot's SnapshotInfo as a JSON list")
    ap.add_argument("--relay-host", default="", help="relay on this address (empty: no relay)")
    asyncio.run(fetch_one(ap.parse_args()))


if __name__ == "__main__":
    main()
