"""Weight publication on a CPU: what the training thread and the writer pay, vs bare baselines.

    python bench/publish.py [--hidden 768 --layers 12 --vocab 32000] [--repeats 5] [--json PATH]

A Llama-shaped model (default ~110M parameters, fp32 master weights, tied embeddings) is
published as bf16 snapshots through `consumer.snapshots.publisher.Publisher`, as the learner does:
- `block_over_copy`: the training thread's time in `Publisher.submit` (the writer idle) over a
  bare copy of the same bytes: one `copy_` of one flat fp32 tensor holding as many elements into
  a preallocated bf16 tensor (same bytes read, same bytes written, same conversion, no per-tensor
  or bookkeeping cost). Target <= 1.2.
- `writer_over_write`: the writer's time per snapshot until it can be announced
  (`Publisher.last_write_s`: write and BLAKE3 hash of the file, config files, manifest, fsyncs,
  rename) over a raw `os.write` of the same number of bytes to a new file with `fsync`, then
  `close`. Target <= 1.5. The same with `snapshot.fsync = "off"` against a raw write without
  fsync: `writer_over_write_nofsync`. `prune_s`: deleting the snapshot that rotation drops,
  after the announcement (reported apart: it is not on the way to producers).
- `block_busy_s_max`: the longest submit while the writer is busy (back-to-back publishes;
  the waiting versions are superseded, `num_superseded`), which must stay a copy.
- for reference, the publication this replaced: per-tensor copies to CPU (`old_to_cpu_s`),
  `safetensors.torch.save` to bytes, hash, write (`old_writer_s`).
Baselines and ours alternate in every round, in a shuffled order (the machine may be shared, and
whatever runs first after another copy pays for it); medians are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.weights import snapshot as snap
from consumer.snapshots.publisher import Publisher
from consumer.snapshots.weights_buffer import table_for, unique_tensors


def build_state(hidden: int, layers: int, vocab: int) -> dict[str, torch.Tensor]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=layers, num_attention_heads=12, num_key_value_heads=4,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.no_grad():
        model = LlamaForCausalLM(config)
    return {k: v.detach() for k, v in model.state_dict().items()}


def raw_write(path: Path, data: memoryview, *, fsync: bool) -> float:
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    done = 0
    while done < len(data):
        done += os.write(fd, data[done : done + (256 << 20)])
    if fsync:
        os.fsync(fd)
    os.close(fd)
    elapsed = time.perf_counter() - t0
    path.unlink()
    return elapsed


def old_publication(state: dict[str, torch.Tensor], root: Path, version: int) -> dict[str, float]:
    """What the learner paid before: per-tensor copies, serialize to bytes, hash, write."""
    from safetensors.torch import save

    t0 = time.perf_counter()
    cpu = {k: v.to("cpu", torch.bfloat16).contiguous() for k, v in unique_tensors(state).items()}
    t1 = time.perf_counter()
    data = save(cpu, metadata={"format": "pt"})
    digest = snap.hash_bytes(data)
    final = snap.snapshot_dir(root, version)
    tmp = root / f"{final.name}.tmp-old"
    tmp.mkdir(parents=True)
    (tmp / snap.WEIGHTS_FILE).write_bytes(data)
    snap.finalize(tmp, final, snap.Manifest(version, version, digest, len(data), "bf16", 0.0))
    t2 = time.perf_counter()
    return {"old_to_cpu_s": t1 - t0, "old_writer_s": t2 - t1}


def measure(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    state = build_state(a.hidden, a.layers, a.vocab)
    unique = unique_tensors(state)
    numel = sum(t.numel() for t in unique.values())
    table = table_for(unique, torch.bfloat16)
    flat_src = torch.randn(numel)
    flat_dst = torch.zeros(numel, dtype=torch.bfloat16)
    # random bytes, like weights (a virtual disk may treat runs of zeros specially)
    raw = memoryview(torch.randint(0, 256, (table.num_bytes,), dtype=torch.uint8).numpy().data)
    runs: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        runs.setdefault(key, []).append(value)

    publishers = {
        fsync: Publisher(
            work / f"snaps-{fsync}",
            None,
            keep_last=2,
            on_published=lambda i: None,
            fsync="before_announce" if fsync else "off",
        )
        for fsync in (True, False)
    }
    version = 0
    order = random.Random(0)  # each round runs its three parts in a new order: no order bias

    def publish(publisher: Publisher) -> float:
        nonlocal version
        version += 1
        t0 = time.perf_counter()
        publisher.submit(state, version=version, step=version, dtype=torch.bfloat16)
        block_s = time.perf_counter() - t0
        publisher.wait()
        return block_s

    def copy() -> float:
        t0 = time.perf_counter()
        flat_dst.copy_(flat_src)
        return time.perf_counter() - t0

    # One fsync policy at a time: another's dirty pages being flushed would slow this one.
    for fsync, publisher in publishers.items():
        suffix = "" if fsync else "_nofsync"
        for rep in range(a.repeats + 1):  # the first round warms up (allocations, page cache)
            parts: dict[str, Callable[[], float]] = {
                "block_s": partial(publish, publisher),
                "copy_s": copy,
                f"write_s{suffix}": partial(raw_write, work / "raw", raw, fsync=fsync),
            }
            for key in order.sample(sorted(parts), k=3):
                value = parts[key]()
                if rep:
                    add(key, value)
            if rep:
                add(f"writer_s{suffix}", publisher.last_write_s)
                add(f"prune_s{suffix}", publisher.last_prune_s)
    for _ in range(2 * a.repeats):  # more samples of the copies (cheap with no fsync)
        for key in order.sample(["block_s", "copy_s"], k=2):
            add(key, publish(publishers[False]) if key == "block_s" else copy())
    for rep in range(min(a.repeats, 3)):
        for key, value in old_publication(state, work / "old", rep).items():
            add(key, value)
    # back to back: the writer is always busy, every submit must still be one copy
    busy = publishers[True]
    for _ in range(2 * a.repeats):
        version += 1
        t0 = time.perf_counter()
        busy.submit(state, version=version, step=version, dtype=torch.bfloat16)
        add("block_busy_s", time.perf_counter() - t0)
    for publisher in publishers.values():
        publisher.close()
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {
        "block_over_copy": med["block_s"] / med["copy_s"],
        "writer_over_write": med["writer_s"] / med["write_s"],
        "writer_over_write_nofsync": med["writer_s_nofsync"] / med["write_s_nofsync"],
        **med,
        "block_busy_s_max": max(runs["block_busy_s"]),
        "num_superseded": busy.num_superseded,
        "num_parameters": numel,
        "snapshot_bytes": table.num_bytes,
        "num_tensors": len(unique),
        "repeats": a.repeats,
        "torch_threads": torch.get_num_threads(),
        "load_avg_1m": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="snapshots go here (default: /tmp)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir) as work:
        res = measure(a, Path(work))
    mb = res["snapshot_bytes"] / 1e6
    print(f"model: {res['num_parameters'] / 1e6:.0f}M parameters, bf16 snapshot {mb:.0f} MB")
    print(f"training thread  submit {res['block_s']:.3f} s  vs bare copy {res['copy_s']:.3f} s"
          f"  -> block_over_copy {res['block_over_copy']:.2f} (target <= 1.2)")  # fmt: skip
    print(f"                 busy writer: longest submit {res['block_busy_s_max']:.3f} s, "
          f"{res['num_superseded']} versions superseded")  # fmt: skip
    print(f"writer (fsync)   {res['writer_s']:.3f} s  vs raw write+fsync {res['write_s']:.3f} s"
          f"  -> writer_over_write {res['writer_over_write']:.2f} (target <= 1.5)")  # fmt: skip
    print(f"writer (no fsync) {res['writer_s_nofsync']:.3f} s vs raw write "
          f"{res['write_s_nofsync']:.3f} s -> {res['writer_over_write_nofsync']:.2f}")  # fmt: skip
    print(f"rotation after the announcement: {res['prune_s']:.3f} s")
    print(f"before: to CPU {res['old_to_cpu_s']:.3f} s, serialize+hash+write "
          f"{res['old_writer_s']:.3f} s")  # fmt: skip
    print(f"load average {res['load_avg_1m']:.2f}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
