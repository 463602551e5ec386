"""The hf engine with many groups in flight vs one batched `model.generate`, same rows, same run.

    python bench/hf_engine.py [--groups 8] [--group-size 8] [--repeats 30] [--json PATH]

On the demo model (its settings: temperature 1, 5 new tokens, one torch thread):
- baseline: one `model.generate(do_sample=True)` of all groups x G rows, prompts left-padded:
  what a single-process loop pays for the same completions (no per-token log-probs).
- ours: `HFEngine` with one `generate` call per group, all in flight at once (what a producer
  does with that many leases): one batch, exact sampling log-probs, per-lease random streams.
- one at a time: the same calls awaited one after another (one group per batch).
CPU time (`time.process_time`, every thread of the process) and wall time per round, medians
of interleaved repeats.

Closed loop (`--loop-groups`): `--groups` lease slots each generate a group, then take the next,
until `--loop-groups` groups are done, under the engine's three join policies (`join_at`, see
`producer.engines.hf.may_join`): default (new rows join the rows in flight once there are as many
of them), continuous (join at the next token, always) and batch-at-a-time (wait until the batch
drains). Twice: on the demo model (completions of 4-5 tokens) and on a random tiny model whose
completion lengths are geometric (mean ~30 tokens, up to 64): the long-tail case. Rates are
groups per CPU-second of the process (one torch thread: groups/s on an idle machine, and less
disturbed by other load).

JSON keys (stable): engine_over_generate (CPU time ratio, the target), engine_over_generate_wall,
one_at_a_time_over_generate, generate_cpu_ms, engine_cpu_ms, one_at_a_time_cpu_ms,
generate_wall_ms, engine_wall_ms, rows_per_forward (all-in-flight rounds), and for CASE in demo,
longtail and POLICY in default, continuous, batch_at_a_time: CASE_POLICY_groups_per_cpu_s,
CASE_default_over_batch_at_a_time, CASE_continuous_over_batch_at_a_time (throughput ratios,
> 1 = faster than batch-at-a-time); threads, groups, group_size, load_avg_1min.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.task.synthetic import make_examples
from launch.demo_model import ensure_demo_model
from producer.engines.base import SamplingParams
from producer.engines.hf import HFEngine

MAX_NEW = 5  # launch/configs/demo.toml: sampling.max_new_tokens


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(CPU seconds of the whole process, wall seconds) of one call."""
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def one_round(model_dir: Path, groups: int, group_size: int, repeats: int) -> dict[str, float]:
    """Baseline `generate` vs the engine (all in flight, and one at a time), interleaved."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    prompts = [e.prompt for e in make_examples("train", groups, seed=1)]
    rows = tokenizer(
        [p for p in prompts for _ in range(group_size)], return_tensors="pt", padding=True
    )
    prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]

    def generate() -> None:
        with torch.inference_mode():
            model.generate(
                **rows, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=MAX_NEW, pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )  # fmt: skip

    loop = asyncio.new_event_loop()
    engine = HFEngine(model_dir, device="cpu", seed=0)
    loop.run_until_complete(engine.load_weights(model_dir, 0))

    def params(i: int) -> SamplingParams:
        return SamplingParams(n=group_size, temperature=1.0, max_new_tokens=MAX_NEW, seed=i)

    async def all_in_flight() -> None:
        await asyncio.gather(*(engine.generate(p, params(i)) for i, p in enumerate(prompt_ids)))

    async def one_at_a_time() -> None:
        for i, p in enumerate(prompt_ids):
            await engine.generate(p, params(i))

    runs: dict[str, Callable[[], Any]] = {
        "generate": generate,
        "engine": lambda: loop.run_until_complete(all_in_flight()),
        "one_at_a_time": lambda: loop.run_until_complete(one_at_a_time()),
    }
    for fn in runs.values():  # warm-up
        fn()
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    wall: dict[str, list[float]] = {k: [] for k in runs}
    forwards = rows_forwarded = 0
    for _ in range(repeats):
        for name, fn in runs.items():
            before = engine.forwards
            c, w = timed(fn)
            cpu[name].append(c)
            wall[name].append(w)
            if name == "engine":
                forwards += engine.forwards[0] - before[0]
                rows_forwarded += engine.forwards[1] - before[1]
    loop.run_until_complete(engine.close())
    loop.close()
    med = {f"{k}_cpu_ms": statistics.median(v) * 1e3 for k, v in cpu.items()}
    med |= {f"{k}_wall_ms": statistics.median(v) * 1e3 for k, v in wall.items()}
    return med | {
        "engine_over_generate": med["engine_cpu_ms"] / med["generate_cpu_ms"],
        "engine_over_generate_wall": med["engine_wall_ms"] / med["generate_wall_ms"],
        "one_at_a_time_over_generate": med["one_at_a_time_cpu_ms"] / med["generate_cpu_ms"],
        "rows_per_forward": rows_forwarded / forwards,
    }


def closed_loop(
    model_dir: Path, *, join_at: float, slots: int, total: int, group_size: int, max_new: int,
    prompts: list[list[int]],
) -> float:  # fmt: skip
    """Groups per CPU-second (the whole process) with `slots` leases in flight, `total` groups."""

    async def run() -> float:
        engine = HFEngine(model_dir, device="cpu", seed=0, join_at=join_at)
        await engine.load_weights(model_dir, 0)
        next_id = 0

        async def slot() -> None:
            nonlocal next_id
            while next_id < total:
                i, next_id = next_id, next_id + 1
                params = SamplingParams(
                    n=group_size, temperature=1.0, max_new_tokens=max_new, seed=i
                )
                await engine.generate(prompts[i % len(prompts)], params)

        c0 = time.process_time()
        await asyncio.gather(*(slot() for _ in range(slots)))
        elapsed = time.process_time() - c0
        await engine.close()
        return total / elapsed

    return asyncio.run(run())


def random_tiny_model(directory: Path) -> list[list[int]]:
    """A random 2-layer Llama (vocab 32, EOS 1): geometric completion lengths. Its prompts."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=256,
        tie_word_embeddings=True, eos_token_id=1, pad_token_id=0, bos_token_id=None,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(directory)
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(2, 32, (int(n),), generator=gen).tolist() for n in range(4, 12)]


POLICIES = {"default": 1.0, "continuous": 0.0, "batch_at_a_time": math.inf}  # join_at


def loops(model_dir: Path, a: argparse.Namespace) -> dict[str, float]:
    """Closed-loop groups/s of each join policy, on the demo and on the long-tail model."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    demo_prompts = [tokenizer(e.prompt)["input_ids"] for e in make_examples("train", 64, seed=2)]
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tail_prompts = random_tiny_model(Path(tmp))
        cases = [
            ("demo", model_dir, demo_prompts, MAX_NEW),
            ("longtail", Path(tmp), tail_prompts, 64),
        ]
        for name, directory, prompts, max_new in cases:
            rates: dict[str, list[float]] = {policy: [] for policy in POLICIES}
            for _ in range(3):  # interleaved
                for policy, join_at in POLICIES.items():
                    rate = closed_loop(
                        directory, join_at=join_at, slots=a.groups, total=a.loop_groups,
                        group_size=a.group_size, max_new=max_new, prompts=prompts,
                    )  # fmt: skip
                    rates[policy].append(rate)
            for policy, values in rates.items():
                out[f"{name}_{policy}_groups_per_cpu_s"] = statistics.median(values)
            base = out[f"{name}_batch_at_a_time_groups_per_cpu_s"]
            for policy in ("default", "continuous"):
                out[f"{name}_{policy}_over_batch_at_a_time"] = (
                    out[f"{name}_{policy}_groups_per_cpu_s"] / base
                )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=8, help="groups (leases) in flight")
    ap.add_argument("--group-size", type=int, default=8, help="G, completions per group")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--loop-groups", type=int, default=96, help="groups per closed-loop run")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a producer's)")
    ap.add_argument("--json", type=Path, help="write the results here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model_dir = ensure_demo_model()
    res: dict[str, float] = {
        "threads": a.threads, "groups": a.groups, "group_size": a.group_size,
        "load_avg_1min": os.getloadavg()[0],
    }  # fmt: skip
    res |= one_round(model_dir, a.groups, a.group_size, a.repeats)
    res |= loops(model_dir, a)
    rows = a.groups * a.group_size
    print(f"{a.groups} groups x G={a.group_size} = {rows} rows, {MAX_NEW} new tokens, demo model")
    print(f"baseline  model.generate, {rows} rows      : {res['generate_cpu_ms']:7.1f} ms CPU")
    print(f"ours      engine, {a.groups} groups in flight   : {res['engine_cpu_ms']:7.1f} ms CPU")
    print(f"          engine, one group at a time : {res['one_at_a_time_cpu_ms']:7.1f} ms CPU")
    print(f"ratio engine/generate (CPU)           : {res['engine_over_generate']:7.2f}")
    print(f"ratio engine/generate (wall)          : {res['engine_over_generate_wall']:7.2f}")
    print(f"rows per forward                      : {res['rows_per_forward']:7.1f}")
    for name in ("demo", "longtail"):
        print(f"closed loop, {name}: groups per CPU-second (ratio vs batch-at-a-time)")
        for policy in POLICIES:
            rate = res[f"{name}_{policy}_groups_per_cpu_s"]
            ratio = res.get(f"{name}_{policy}_over_batch_at_a_time", 1.0)
            print(f"  {policy:16} join_at={POLICIES[policy]:<4} {rate:7.1f}  ({ratio:.2f}x)")
    print(f"load average (1 min) at start         : {res['load_avg_1min']:7.2f}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
