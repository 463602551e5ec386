"""Snapshot fan-out: N producers fetch one snapshot over the network, through the consumer alone
and through a relay tree, every chunk verified; a probe producer's lease latency meanwhile.

    python bench/fanout.py [--mib 64] [--fetchers 1,8,64] [--fanout 4] [--dir /dev/shm]
                           [--json PATH]
    python bench/fanout.py --link-mbit R [--mib 8] [--fetchers 16] [--json PATH]

`--link-mbit R` runs bench/fanout_links.py instead: hosts as network namespaces, every link
capped at R Mbit/s with tc tbf, so the links, not this machine's cores, bound the transfer.
What follows describes the run without it.

The consumer in its own process, as deployed: its real network and data threads
(consumer/server/server.py plans fetches on control, consumer/snapshots/dataplane.py serves chunks
on the data socket; ZeroMQ on loopback) serving a snapshot of `--mib` MiB written by the real
publisher (bf16, chunk hashes), and N fetchers (producer/fetch/fetcher.py, each with its own DEALERs
and, in relay mode, its own relay ROUTER) in one asyncio loop, all started at once. Every fetcher
writes its own file (`--dir`; a tmpfs keeps the disk out of it) and verifies it.

Reported per mode and N (`consumer_<N>`: no relays, the consumer serves everyone; `relays_<N>`:
every fetcher relays, fan-out `--fanout`):
- `per_producer_s` (median, p90, max: from the common start to that fetcher's verified file),
  `wall_s`, `aggregate_MBps` (N * size / wall), `consumer_copies` (bytes the consumer sent /
  size: its egress in snapshots), `from_relay` (fetches served by a relay);
- `max_over_single`: the slowest fetcher over one fetcher alone (target at 64: <= 3);
- `lease_p99_ms`, `lease_max_ms`: control round trips of a probe producer (a heartbeat every
  10 ms, from its own process: what a lease request costs when leases are there to grant)
  while the fan-out runs (target <= 50 ms); `lease_idle_p99_ms`:
  the same probe during the second before, with nothing else going on.
And `single_MBps` (one fetch, target >= 1000: the best of `--repeat` single fetches).

All N fetchers share this machine's cores, so on one host the total work (N copies hashed and
written; twice hashed from a relay) bounds the aggregate rate whatever the tree does; what
relays change is how much the consumer sends (`consumer_copies`), which is what limits a real
deployment across hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import zmq
import zmq.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import config as C
from common import wire
from common.weights import snapshot as snap
from consumer.data.prompts import make_source
from consumer.server.server import Server
from consumer.server.wire_terms import run_spec
from consumer.snapshots.fetch_files import FetchFiles
from consumer.snapshots.publisher import Publisher
from producer.control import ControlClient
from producer.fetch.fetcher import Fetcher
from producer.fetch.relay import Relay

MAX_MESSAGE = 64 << 20


def start_consumer(
    run_dir: Path, *, fanout: int, mib: int, chunk_mib: float, bind: str = ""
) -> tuple[Server, zmq.Context[zmq.Socket[bytes]], wire.SnapshotInfo]:
    settings: dict[str, object] = {
        "net.control_port": 0, "snapshot.fanout": fanout, "net.producer_timeout_s": 3600.0,
        "snapshot.chunk_mib": chunk_mib,
    }  # fmt: skip
    if bind:  # an address of a namespace of its own (--link-mbit): no keys on that test net
        settings |= {"net.bind_host": bind, "net.insecure": True}
    cfg = C.override(C.Config(), settings)
    ctx = zmq.Context()
    spec = run_spec(cfg, vocab_size=32, model="")
    server = Server(
        cfg, ctx, prompts=make_source(cfg.task, seed=0), spec=spec, run_dir=run_dir, keys=None
    )
    server.start()
    snaps = run_dir / "snapshots"
    infos: list[wire.SnapshotInfo] = []
    if not (snaps / "v000000").exists():
        dist = FetchFiles(chunk_bytes=int(chunk_mib * (1 << 20)), anchor_every=0, max_ratio=0.5)
        publisher = Publisher(snaps, None, keep_last=2, on_published=infos.append, fetch_files=dist)
        weights = torch.randn(mib << 19, generator=torch.Generator().manual_seed(0))
        publisher.submit({"w": weights}, version=0, step=0, dtype=torch.bfloat16)
        publisher.close()
        info = infos[0]
    else:
        m = snap.read_manifest(snaps / "v000000")
        info = wire.SnapshotInfo(0, m.num_bytes, m.hash, str(snaps / "v000000" / snap.WEIGHTS_FILE))
    server.announce_snapshot(info)
    return server, ctx, info


def serve_consumer(run_dir: Path, *, fanout: int, mib: int, chunk_mib: float, bind: str) -> None:
    """The consumer's own process (`--consumer`): prints its ports and snapshot as one JSON
    line, then answers each stdin line with its counters (one JSON line) until stdin closes."""
    server, ctx, info = start_consumer(
        run_dir, fanout=fanout, mib=mib, chunk_mib=chunk_mib, bind=bind
    )
    try:
        print(json.dumps({"ports": server.ports, "info": dataclasses.astuple(info)}), flush=True)
        for _ in sys.stdin:
            print(json.dumps(dict(server.view()["counters"])), flush=True)
    finally:
        server.stop()
        ctx.destroy(linger=0)


class ConsumerProcess:
    """A consumer in its own process, as in a deployment (so its network thread does not share
    an interpreter lock with the fetchers)."""

    def __init__(self, run_dir: Path, *, fanout: int, mib: int, chunk_mib: float) -> None:
        argv = [sys.executable, __file__, "--consumer", str(run_dir), "--fanout", str(fanout),
                "--mib", str(mib), "--chunk-mib", str(chunk_mib)]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = self._line()
        self.ports: dict[str, int] = first["ports"]
        self.info = wire.SnapshotInfo(*first["info"])

    def _line(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the consumer process exited ({self.proc.wait()})")
        return json.loads(line)

    def counters(self) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("counters\n")
        self.proc.stdin.flush()
        return self._line()  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


async def registered(
    ctx: zmq.asyncio.Context, endpoint: str, name: str
) -> tuple[ControlClient, asyncio.Task[None]]:
    control = ControlClient(ctx, endpoint, keys=None, max_message_bytes=MAX_MESSAGE)
    reader = asyncio.create_task(control.read_replies())
    await control.request(
        wire.Register(0, name, "bench", os.getpid(), "fake", -1, ()), timeout_s=30
    )
    return control, reader


async def probe(endpoint: str, work: Path) -> None:
    """The probe producer (its own process, as a real one would be): a control request (a
    heartbeat: the consumer answers it at once, as it answers a lease request when it has
    leases to grant; a lease request itself may be held back by design) every 10 ms until
    `work/stop` appears; the round trips (s) go to `work/latencies.json`."""
    ctx = zmq.asyncio.Context()
    control, reader = await registered(ctx, endpoint, "probe")
    (work / "ready").touch()
    out: list[tuple[float, float]] = []  # (unix time sent, round trip s)
    try:
        while not (work / "stop").exists():
            sent, t0 = time.time(), time.perf_counter()
            await control.request(wire.Heartbeat(0, "probe", -1, "idle", 0, {}), timeout_s=30)
            out.append((sent, time.perf_counter() - t0))
            await asyncio.sleep(0.01)
    finally:
        reader.cancel()
        control.close()
        ctx.destroy(linger=0)
    (work / "latencies.json").write_text(json.dumps(out))


def start_probe(endpoint: str, work: Path) -> subprocess.Popen[bytes]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, __file__, "--probe", endpoint, "--dir", str(work)])
    while not (work / "ready").exists():
        if proc.poll() is not None:
            raise RuntimeError("the probe producer exited")
        time.sleep(0.01)
    return proc


def stop_probe(
    proc: subprocess.Popen[bytes], work: Path, since: float
) -> tuple[list[float], list[float]]:
    """Round trips (sorted) before and after the unix time `since`."""
    (work / "stop").touch()
    proc.wait(60)
    samples = json.loads((work / "latencies.json").read_text())
    before = sorted(lat for sent, lat in samples if sent < since)
    return before, sorted(lat for sent, lat in samples if sent >= since)


def p99(values: list[float]) -> float:
    return 1e3 * values[min(len(values) - 1, int(0.99 * len(values)))] if values else float("nan")


async def fan_out(
    ports: dict[str, int], info: wire.SnapshotInfo, n: int, *, relays: bool, where: Path
) -> dict[str, Any]:
    endpoint = f"tcp://127.0.0.1:{ports['control']}"
    data_endpoint = f"tcp://127.0.0.1:{ports['data']}"
    ctx = zmq.asyncio.Context()
    tasks: list[asyncio.Task[Any]] = []
    closers: list[Any] = []
    try:
        fetchers = []
        for i in range(n):
            control, reader = await registered(ctx, endpoint, f"f{i}")
            tasks.append(reader)
            closers.append(control)
            relay = None
            if relays:
                relay = Relay(
                    ctx,
                    host="127.0.0.1",
                    port=0,
                    keys=None,
                    insecure=False,
                    max_message_bytes=MAX_MESSAGE,
                )
                tasks.append(asyncio.create_task(relay.serve()))
                closers.append(relay)
            fetchers.append(
                Fetcher(
                    control,
                    ctx,
                    data_endpoint=data_endpoint,
                    producer_id=f"f{i}",
                    keys=None,
                    max_message_bytes=MAX_MESSAGE,
                    report=functools.partial(control.request, timeout_s=120),
                    relay=relay,
                    timeout_s=120,
                    relay_timeout_s=60,
                )
            )
        prober = start_probe(endpoint, where / "probe")
        await asyncio.sleep(1.0)  # the probe alone: its idle latency
        since, t0 = time.time(), time.perf_counter()

        async def one(i: int) -> tuple[float, str]:
            await fetchers[i].fetch(info, where / f"f{i}", held=None)
            source = "relay" if fetchers[i].counters.get("chunks_from_relay") else "consumer"
            return time.perf_counter() - t0, source

        results = await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - t0
        idle, lat = stop_probe(prober, where / "probe", since)
        times = sorted(t for t, _ in results)
        return {
            "per_producer_s": {
                "median": statistics.median(times),
                "p90": times[int(0.9 * (len(times) - 1))],
                "max": times[-1],
            },
            "wall_s": wall,
            "aggregate_MBps": n * info.num_bytes / wall / 1e6,
            "from_relay": sum(1 for _, s in results if s == "relay"),
            "lease_p99_ms": p99(lat),
            "lease_idle_p99_ms": p99(idle),
            "lease_max_ms": 1e3 * lat[-1] if lat else float("nan"),
            "lease_requests": len(lat),
        }
    finally:
        for task in tasks:
            task.cancel()
        for c in closers:
            c.close()
        ctx.destroy(linger=0)
        shutil.rmtree(where, ignore_errors=True)


def report(mode: str, n: int, r: dict[str, Any]) -> None:
    per = r["per_producer_s"]
    print(
        f"{mode:8s} N={n:3d}: per producer median {per['median']:.2f} s, max {per['max']:.2f} s, "
        f"aggregate {r['aggregate_MBps']:.0f} MB/s, consumer sent {r['consumer_copies']:.1f} "
        f"copies, {r['from_relay']} via relays, lease p99 {r['lease_p99_ms']:.1f} ms "
        f"(max {r['lease_max_ms']:.1f}; idle p99 {r['lease_idle_p99_ms']:.1f})",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="snapshot size (MiB)")
    parser.add_argument("--fetchers", default="1,8,64", help="comma-separated N")
    parser.add_argument("--fanout", type=int, default=4, help="snapshot.fanout in relay mode")
    parser.add_argument(
        "--dir", type=Path, default=Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    )
    parser.add_argument("--chunk-mib", type=float, default=4.0, help="snapshot.chunk_mib")
    parser.add_argument("--modes", default="consumer,relays", help="consumer and/or relays")
    parser.add_argument(
        "--repeat", type=int, default=1, help="single fetches (consumer, N=1): the best of"
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--link-mbit", type=float, default=0.0,
        help="hosts as network namespaces, every link capped at this rate with tc tbf "
        "(bench/fanout_links.py; needs root): one producer alone, then --fetchers (one N, "
        "16 by default) with relays off and on",
    )  # fmt: skip
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per --link-mbit run")
    parser.add_argument("--probe", help=argparse.SUPPRESS)  # the probe producer's process
    parser.add_argument("--consumer", type=Path, help=argparse.SUPPRESS)  # the consumer's
    parser.add_argument("--bind", default="", help=argparse.SUPPRESS)  # the consumer's address
    args = parser.parse_args()
    if args.probe:
        asyncio.run(probe(args.probe, args.dir))
        return
    if args.consumer:
        serve_consumer(
            args.consumer, fanout=args.fanout, mib=args.mib, chunk_mib=args.chunk_mib,
            bind=args.bind,
        )  # fmt: skip
        return
    if args.link_mbit > 0:
        links(args)
        return
    out: dict[str, Any] = {
        "mib": args.mib,
        "fanout": args.fanout,
        "chunk_mib": args.chunk_mib,
        "load_avg_1m": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        counts = [int(x) for x in args.fetchers.split(",")]
        singles = []
        for mode in args.modes.split(","):
            for n in counts:
                fanout = args.fanout if mode == "relays" else 1 << 20
                consumer = ConsumerProcess(
                    root / "run", fanout=fanout, mib=args.mib, chunk_mib=args.chunk_mib
                )
                info = consumer.info
                try:
                    runs = []
                    # (relays: one run per consumer, which remembers who relays what)
                    for _ in range(args.repeat if (n, mode) == (1, "consumer") else 1):
                        before = consumer.counters().get("chunk_bytes_served", 0)
                        r = asyncio.run(
                            fan_out(
                                consumer.ports, info, n, relays=mode == "relays", where=root / "f"
                            )
                        )
                        served = consumer.counters().get("chunk_bytes_served", 0) - before
                        r["consumer_copies"] = served / info.num_bytes
                        runs.append(r)
                    r = min(runs, key=lambda r: r["per_producer_s"]["max"])
                finally:
                    consumer.stop()
                if n == 1 and mode == "consumer":
                    singles.append(r["per_producer_s"]["max"])
                out[f"{mode}_{n}"] = r
                report(mode, n, r)
        if singles:
            single = min(singles)
            out["single_s"] = single
            out["single_MBps"] = info.num_bytes / single / 1e6
            for r in out.values():
                if isinstance(r, dict) and "per_producer_s" in r:
                    r["max_over_single"] = r["per_producer_s"]["max"] / single
    out["load_avg_1m_end"] = os.getloadavg()[0]
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, dict)}))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


def links(args: argparse.Namespace) -> None:
    """`--link-mbit`: bench/fanout_links.py's runs (defaults there: 8 MiB, 1 MiB chunks, 16)."""
    from fanout_links import run_links  # this directory: bench/fanout_links.py

    if "--fetchers" not in sys.argv:
        args.fetchers = "16"
    if "--mib" not in sys.argv:
        args.mib = 8
    if "--chunk-mib" not in sys.argv:
        args.chunk_mib = 1.0
    args.fetchers = int(args.fetchers)
    out = run_links(args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
