"""Snapshot transfer over a network link vs raw ZeroMQ throughput of the same bytes, same link.

    python bench/snapshot_link.py [--mib 64] [--repeats 3] [--insecure] [--json PATH]   # root

Two hosts as network namespaces joined by veth pairs (tests/netns.py): host a serves, host b
fetches; CurveZMQ on both sides unless --insecure.
- ours: the path every producer without a shared filesystem takes. A registered producer's
  `Fetcher` (producer/fetch/fetcher.py) asks the consumer (consumer/server/server.py) for a fetch
  plan over control, then takes the chunks from the consumer's data socket
  (consumer/snapshots/dataplane.py): several requests in flight, each chunk written at its offset
  and the file BLAKE3-hashed as it lands, renamed once the hash matches. The snapshot (MIB MiB of
  random bytes, chunks of `--chunk-mib`, the consumer's default) is laid out as the publisher writes
  it: file, manifest, per-chunk hashes.
- baseline: raw ZeroMQ on the same link: a DEALER asks once, a ROUTER answers with the same
  bytes in chunks of the same size, back to back; nothing written, nothing hashed.
Prints MB/s of each (best of the repeats) and their ratio (ours / raw); `--json` writes them
under stable keys. Every wait has a bound: a transfer that stalls fails after 120 s, and the
serving host is given 30 s to stop before it is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def serve(directory: Path, host: str, mib: float, chunk_mib: float, keys: str) -> None:
    """Host a: a consumer's network and data threads with one snapshot, and a raw ROUTER;
    prints the endpoints and snapshot info as one JSON line, then serves until stdin closes."""
    import dataclasses
    import threading

    import zmq

    from common import config as C
    from common import wire
    from common.net.keys import load_keys
    from common.weights import chunk_manifest as cm
    from common.weights import snapshot as snap
    from consumer.data.prompts import make_source
    from consumer.key_gate import start_key_gate
    from consumer.server.server import Server
    from consumer.server.wire_terms import run_spec

    chunk = int(chunk_mib * (1 << 20))
    data = os.urandom(int(mib * (1 << 20)))
    folder = snap.snapshot_dir(directory / "snapshots", 1)
    folder.mkdir(parents=True)
    (folder / snap.WEIGHTS_FILE).write_bytes(data)
    digest = snap.hash_bytes(data)
    manifest = snap.Manifest(1, 1, digest, len(data), "bfloat16", time.time())
    (folder / snap.MANIFEST_FILE).write_text(json.dumps(dataclasses.asdict(manifest)))
    cm.write_chunks(folder, cm.Chunks({"weights": cm.chunk_hashes(data, chunk)}))
    info = wire.SnapshotInfo(1, len(data), digest, str(folder / snap.WEIGHTS_FILE))
    sets = [f"net.bind_host={host}", "net.control_port=0", f"snapshot.chunk_mib={chunk_mib}"]
    if not keys:
        sets.append("net.insecure=true")
    cfg = C.apply_overrides(C.Config(), sets)
    ctx = zmq.Context()
    server_keys = load_keys(keys, "server") if keys else None
    gate = start_key_gate(ctx, server_keys) if server_keys else None
    spec = run_spec(cfg, vocab_size=32, model="")
    srv = Server(cfg, ctx, prompts=make_source(cfg.task, seed=0), spec=spec, run_dir=directory,
                 keys=server_keys)  # fmt: skip
    srv.start()
    srv.announce_snapshot(info)
    raw = ctx.socket(zmq.ROUTER)
    raw.setsockopt(zmq.LINGER, 0)
    if server_keys:
        raw.curve_secretkey, raw.curve_publickey = server_keys.secret, server_keys.public
        raw.curve_server = True
    raw_port = raw.bind_to_random_port(f"tcp://{host}")
    stop = threading.Event()

    def answer_raw() -> None:  # owns `raw`; looks at `stop` at least every 100 ms
        while not stop.is_set():
            if not raw.poll(100):
                continue
            who, _ = raw.recv_multipart()
            for offset in range(0, len(data), chunk):
                raw.send_multipart([who, data[offset : offset + chunk]], copy=False)
        raw.close(linger=0)

    answering = threading.Thread(target=answer_raw, daemon=True)
    answering.start()
    where = {"control": f"tcp://{host}:{srv.ports['control']}", "raw": f"tcp://{host}:{raw_port}",
             "info": [1, len(data), info.hash, info.path]}  # fmt: skip
    print(json.dumps(where), flush=True)
    sys.stdin.read()
    stop.set()
    answering.join(10)
    srv.stop()
    if gate is not None:
        gate.stop()
    ctx.destroy(linger=0)


def fetch(control: str, raw: str, info_fields: list[Any], keys: str, repeats: int) -> None:
    """Host b: time both transfers `repeats` times; prints the seconds as one JSON line."""
    import zmq
    import zmq.asyncio

    from common import wire
    from common.net.keys import load_keys
    from common.net.sockets import endpoint_with_port
    from producer.control import ControlClient
    from producer.fetch.fetcher import Fetcher

    info = wire.SnapshotInfo(*info_fields)
    client_keys = load_keys(keys, "client") if keys else None
    ours_s, raw_s = [], []

    async def ours_once(tmp: Path, i: int) -> float:
        ctx = zmq.asyncio.Context()
        client = ControlClient(ctx, control, keys=client_keys, max_message_bytes=64 << 20)
        reader = asyncio.create_task(client.read_replies())
        try:
            async with asyncio.timeout(120):
                name = f"b{i}"
                msg = wire.Register(0, name, "b", os.getpid(), "bench", -1, ())
                welcome = await client.request(msg, timeout_s=60)
                assert isinstance(welcome, wire.Welcome), welcome
                fetcher = Fetcher(
                    client, ctx, data_endpoint=endpoint_with_port(control, welcome.spec.data_port),
                    producer_id=name, keys=client_keys, max_message_bytes=64 << 20,
                    report=functools.partial(client.request, timeout_s=60),
                )  # fmt: skip
                t0 = time.perf_counter()
                await fetcher.fetch(info, tmp, held=None)
                return time.perf_counter() - t0
        finally:
            reader.cancel()
            client.close()
            ctx.destroy(linger=0)

    def raw_once() -> float:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 120_000)  # a stalled transfer fails, never hangs
        if client_keys:
            sock.curve_secretkey, sock.curve_publickey = client_keys.secret, client_keys.public
            sock.curve_serverkey = client_keys.server_public
        sock.connect(raw)
        try:
            t0 = time.perf_counter()
            sock.send(b"go")
            got = 0
            while got < info.num_bytes:
                got += len(sock.recv(copy=False))
            return time.perf_counter() - t0
        finally:
            sock.close(linger=0)
            ctx.term()

    for i in range(repeats):  # interleaved, so that both see the same machine
        raw_s.append(raw_once())
        with tempfile.TemporaryDirectory() as tmp:
            ours_s.append(asyncio.run(ours_once(Path(tmp) / f"v{i}", i)))
    print(json.dumps({"ours_s": ours_s, "raw_s": raw_s}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mib", type=float, default=64.0, help="snapshot size, MiB")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--chunk-mib", type=float, default=4.0, help="chunk size, MiB (snapshot.chunk_mib)"
    )
    ap.add_argument("--insecure", action="store_true", help="no CurveZMQ on either side")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--role", choices=["serve", "fetch"], help=argparse.SUPPRESS)
    ap.add_argument("--arg", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "serve":
        return serve(Path(args.arg[0]), args.arg[1], args.mib, args.chunk_mib, args.arg[2])
    if args.role == "fetch":
        c, r, info, keys = args.arg
        return fetch(c, r, json.loads(info), keys, args.repeats)

    import netns

    from common.net.keys import create_keys

    why = netns.unavailable()
    if why:
        sys.exit(f"cannot build the link: {why}")
    me = [sys.executable, str(Path(__file__).resolve())]
    with tempfile.TemporaryDirectory() as tmp, netns.Hosts(["a", "b"]) as hosts:
        keys = Path(tmp) / "keys"
        server_keys = client_keys = ""
        if not args.insecure:
            create_keys(keys, ["b"])
            server_keys, client_keys = str(keys), str(keys / "producers" / "b")
        sizes = ["--mib", str(args.mib), "--repeats", str(args.repeats),
                 "--chunk-mib", str(args.chunk_mib)]  # fmt: skip
        serving = subprocess.Popen(
            hosts.argv("a", [*me, "--role", "serve", *sizes, "--arg", tmp, "--arg",
                             hosts.addr["a"], "--arg", server_keys]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert serving.stdout is not None
            where = json.loads(serving.stdout.readline())
            out = subprocess.run(
                hosts.argv("b", [*me, "--role", "fetch", *sizes, "--arg", where["control"],
                                 "--arg", where["raw"], "--arg", json.dumps(where["info"]),
                                 "--arg", client_keys]),
                capture_output=True, text=True, check=True, timeout=1800,
            )  # fmt: skip
        finally:
            if serving.stdin:
                serving.stdin.close()
            try:
                serving.wait(30)
            except subprocess.TimeoutExpired:  # a teardown that hangs must not hang the bench
                serving.kill()
                serving.wait(10)
    times = json.loads(out.stdout.strip().splitlines()[-1])
    mb = args.mib * (1 << 20) / 1e6
    ours, raw = mb / min(times["ours_s"]), mb / min(times["raw_s"])
    result = {
        "snapshot_mib": args.mib, "chunk_mib": args.chunk_mib, "curve": not args.insecure,
        "repeats": args.repeats,
        "raw_zmq_mb_per_s": round(raw, 1), "ours_mb_per_s": round(ours, 1),
        "ratio_ours_vs_raw": round(ours / raw, 3), "load_avg_1m": os.getloadavg()[0],
    }  # fmt: skip
    print(
        f"snapshot over a veth link, {args.mib:g} MiB, CurveZMQ {'off' if args.insecure else 'on'}"
    )
    print(f"  raw ZeroMQ (same bytes, same chunks): {raw:8.1f} MB/s")
    print(f"  ours (fetch plan, data socket, written and BLAKE3-verified): {ours:8.1f} MB/s")
    print(f"  ratio ours / raw: {ours / raw:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
