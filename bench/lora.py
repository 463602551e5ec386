"""LoRA against the full fine-tune, same model, same run: publication, learner memory, sampling.

    python bench/lora.py --model models/smollm2-135m-instruct --json out.json

On SmolLM2-135M-Instruct in float32 on the CPU (docs/real_model.md; `model.lora` at its defaults
unless `--rank`), each figure measured for both in the same process run:
- publication (`pub_*`): step done -> the producer samples the new version. Per version, the
  trainer's weights move (a step's worth of noise on what it trains), then the clock runs from
  `Publisher.submit` (the learner's copy) through the writer thread (write, BLAKE3, announce) to
  the producer's side: `pin_local` of the announced file into a private directory (the hash
  taken from the manifest written on this host, `producer.trust_local_hash`, as on one host)
  and `HFEngine.load_weights` (full: every tensor copied in; LoRA: merged into the engine's copy
  of the base) returning. One process, the writer and the engine on their own threads; medians
  over `--versions`. Also the bytes of one snapshot file.
- memory (`mem_*`): the peak RSS (ru_maxrss) of a fresh process that builds the learner
  (`DeviceTrainer`), takes `--steps` optimizer steps on groups shaped like the capitals task
  (8 prompts x G 4, 40 prompt tokens, 8 completion tokens) and publishes each version as the
  learner does. Each mode in its own process; with the task's settings (`mem_*`) and with
  `model.gradient_checkpointing` on for both (`mem_ckpt_*`): the activations of a step are the
  same with or without LoRA (the input gradient runs through every layer either way), so
  LoRA saves the optimizer state, the gradients and the snapshot buffers, and the ratio
  depends on how much of the peak the activations are.
- engine (`engine_*`): the hf engine's two ways to sample with an adapter, on the same prompts
  and seeds: merged into the weights (what the engine does: producer/engines/hf_adapter.py) and
  peft's LoRA layers in the engine's model (the adapter applied at every token). Wall time of
  one round of `--prompts` groups of G 4, medians over rounds run alternately.

JSON keys (stable): pub_full_bytes, pub_lora_bytes, pub_bytes_ratio, pub_full_s, pub_lora_s,
pub_latency_ratio, mem_full_mib, mem_lora_mib, mem_ratio, mem_ckpt_full_mib, mem_ckpt_lora_mib,
mem_ckpt_ratio, engine_merged_s, engine_unmerged_s,
engine_unmerged_over_merged, rank, trainable_params, total_params, threads, load_avg_1min.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import config as C
from common import wire
from common.weights import snapshot as snap

ROOT = Path(__file__).resolve().parents[1]


def load() -> float:
    return os.getloadavg()[0]


def config(model: Path, lora: bool, rank: int, *, checkpointing: bool = False) -> C.Config:
    values: dict[str, object] = {
        "model.path": str(model),
        "model.device": "cpu",
        "train.lr": 1e-5,
        "sampling.group_size": 4,
        "sampling.max_new_tokens": 8,
        "train.prompts_per_step": 8,
        "snapshot.dtype": "float32",
        "model.lora.enabled": lora,
        "model.lora.rank": rank,
        "model.gradient_checkpointing": checkpointing,
    }
    return C.override(C.Config(), values)


def groups(vocab: int, step: int, *, prompts: int = 8, g: int = 4) -> list[wire.Group]:
    """Groups shaped like the capitals task's: 40 prompt tokens, 8 completion tokens."""
    rng = np.random.default_rng(step)
    out = []
    for i in range(prompts):
        n = 8 * g
        out.append(
            wire.Group(
                lease_id=i,
                producer_id="b",
                prompt_index=i,
                behavior_version=step,
                prompt_ids=rng.integers(2, vocab, 40).astype(np.int32),
                completion_ids=rng.integers(2, vocab, n).astype(np.int32),
                completion_lens=np.full(g, 8, np.int32),
                behavior_logp=-rng.uniform(0.5, 4.0, n).astype(np.float32),
                token_versions=np.zeros(0, np.int32),
                rewards=rng.integers(0, 2, g).astype(np.float32),
                finish_reasons=("length",) * g,
                temperature=1.0,
            )
        )
    return out


# ------------------------------------------------------------------------------ publication
def publication(model: Path, lora: bool, rank: int, versions: int) -> tuple[int, float, int, int]:
    """(bytes of one snapshot file, median seconds submit -> the engine holds the version,
    trained parameters, all parameters)."""
    from consumer.snapshots.publisher import Publisher
    from consumer.train.trainer import DeviceTrainer
    from producer.engines.hf import HFEngine

    trainer = DeviceTrainer(config(model, lora, rank), model)
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    counts = sum(p.numel() for p in trained), sum(p.numel() for p in trainer.model.parameters())
    root = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    ready: list[wire.SnapshotInfo] = []
    published = threading.Event()

    def on_published(info: wire.SnapshotInfo) -> None:
        ready.append(info)
        published.set()

    pub = Publisher(
        root / "snapshots",
        model,
        keep_last=2,
        on_published=on_published,
        fsync="after_announce",
        adapter=trainer.adapter,
    )

    async def run() -> list[float]:
        engine = HFEngine(model, device="cpu")
        times = []
        try:
            for v in range(versions + 1):  # v0 warms up
                with torch.no_grad():
                    for p in trained:
                        p.add_(torch.randn_like(p) * 1e-4)
                published.clear()
                t0 = time.perf_counter()
                pub.submit(trainer.weights(), version=v, step=v, dtype=torch.float32)
                await asyncio.to_thread(published.wait)
                info = ready[-1]
                private = root / "producer" / f"v{v:06d}"
                snap.pin_local(
                    Path(info.path),
                    private,
                    expected_hash=info.hash,
                    expected_bytes=info.num_bytes,
                    trust_writer=True,
                )
                await engine.load_weights(private, v)
                if v:
                    times.append(time.perf_counter() - t0)
        finally:
            await engine.close()
        return times

    times = asyncio.run(run())
    pub.close()
    size = ready[-1].num_bytes
    return size, statistics.median(times), *counts


# ------------------------------------------------------------------------------ memory
def memory_child(model: Path, lora: bool, rank: int, steps: int, checkpointing: bool) -> None:
    """In a fresh process: build the learner, train and publish; print peak RSS in MiB."""
    from consumer.snapshots.publisher import Publisher
    from consumer.train.trainer import DeviceTrainer

    trainer = DeviceTrainer(config(model, lora, rank, checkpointing=checkpointing), model)
    root = Path(tempfile.mkdtemp(prefix="bench-lora-mem-"))
    pub = Publisher(root, model, keep_last=1, on_published=lambda _: None, adapter=trainer.adapter)
    for step in range(1, steps + 1):
        trainer.step(groups(trainer.vocab_size, step))
        pub.submit(trainer.weights(), version=step, step=step, dtype=torch.float32)
    pub.close()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def memory(
    model: Path, lora: bool, rank: int, steps: int, threads: int, checkpointing: bool
) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    args = [sys.executable, __file__, "--model", str(model), "--rank", str(rank)]
    args += ["--steps", str(steps), "--memory-child", "lora" if lora else "full"]
    args += ["--checkpointing"] if checkpointing else []
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=True)
    return float(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------ engine
def engine_rounds(model: Path, rank: int, prompts: int, rounds: int) -> tuple[float, float]:
    """Median seconds of one round of `prompts` groups: (merged, peft layers)."""
    import peft
    from safetensors import safe_open

    from common.weights import adapter as fmt
    from consumer.snapshots.publisher import Publisher
    from consumer.train.trainer import DeviceTrainer
    from producer.engines.base import SamplingParams
    from producer.engines.hf import HFEngine

    trainer = DeviceTrainer(config(model, True, rank), model)
    with torch.no_grad():  # a trained-looking adapter: B away from 0
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 1e-3)
    infos: list[wire.SnapshotInfo] = []
    root = Path(tempfile.mkdtemp(prefix="bench-lora-engine-"))
    pub = Publisher(root, model, keep_last=2, on_published=infos.append, adapter=trainer.adapter)
    pub.submit(trainer.weights(), version=1, step=1, dtype=torch.float32)
    pub.close()
    directory = Path(infos[-1].path).parent
    header = fmt.read_header(directory / snap.WEIGHTS_FILE)
    assert header is not None
    rng = np.random.default_rng(0)
    vocab = trainer.vocab_size
    del trainer
    prompt_ids = [rng.integers(2, vocab, 40).tolist() for _ in range(prompts)]

    async def one_round(engine: Any) -> float:
        params = [
            SamplingParams(n=4, temperature=1.0, max_new_tokens=8, seed=i) for i in range(prompts)
        ]
        t0 = time.perf_counter()
        await asyncio.gather(
            *(engine.generate(p, s) for p, s in zip(prompt_ids, params, strict=True))
        )
        return time.perf_counter() - t0

    async def run() -> tuple[list[float], list[float]]:
        merged = HFEngine(model, device="cpu")
        await merged.load_weights(directory, 1)
        layered = HFEngine(model, device="cpu")  # peft's layers, A and B copied in
        spec = header.spec
        lora = peft.LoraConfig(
            r=spec.rank, lora_alpha=int(spec.alpha), target_modules=spec.target_modules
        )
        peft.inject_adapter_in_model(lora, layered.model)
        with torch.no_grad(), safe_open(str(directory / snap.WEIGHTS_FILE), "pt") as f:
            for name, layer in layered.model.named_modules():
                if isinstance(layer, peft.tuners.lora.LoraLayer):
                    module: Any = layer
                    a, b = fmt.tensor_names(name)
                    module.lora_A["default"].weight.copy_(f.get_tensor(a))
                    module.lora_B["default"].weight.copy_(f.get_tensor(b))
        layered.model.eval()
        times_m, times_l = [], []
        try:
            await one_round(merged)
            await one_round(layered)
            for _ in range(rounds):
                times_m.append(await one_round(merged))
                times_l.append(await one_round(layered))
        finally:
            await merged.close()
            await layered.close()
        return times_m, times_l

    m, lay = asyncio.run(run())
    return statistics.median(m), statistics.median(lay)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2-135m-instruct")
    ap.add_argument("--rank", type=int, default=C.Config().model.lora.rank)
    ap.add_argument("--versions", type=int, default=5, help="publications timed per mode")
    ap.add_argument("--steps", type=int, default=2, help="learner steps in the memory part")
    ap.add_argument("--prompts", type=int, default=8, help="groups per engine round")
    ap.add_argument("--rounds", type=int, default=3, help="engine rounds per way")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--parts", default="publication,memory,engine")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--memory-child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_child:
        lora = args.memory_child == "lora"
        memory_child(args.model, lora, args.rank, args.steps, args.checkpointing)
        return
    parts = set(args.parts.split(","))
    loads = [load()]
    out: dict[str, Any] = {"rank": args.rank, "threads": args.threads}
    if "publication" in parts:
        full_bytes, full_s, _, _ = publication(args.model, False, args.rank, args.versions)
        loads.append(load())
        lora_bytes, lora_s, trainable, total = publication(
            args.model, True, args.rank, args.versions
        )
        loads.append(load())
        out.update(
            pub_full_bytes=full_bytes,
            pub_lora_bytes=lora_bytes,
            pub_bytes_ratio=lora_bytes / full_bytes,
            pub_full_s=full_s,
            pub_lora_s=lora_s,
            pub_latency_ratio=lora_s / full_s,
            trainable_params=trainable,
            total_params=total,
        )
        print(
            f"publication: {lora_bytes:,} B vs {full_bytes:,} B ({lora_bytes / full_bytes:.4f}); "
            f"step -> sampling {lora_s:.3f} s vs {full_s:.3f} s ({lora_s / full_s:.3f}x)"
        )
    if "memory" in parts:
        for prefix, ckpt in (("mem", False), ("mem_ckpt", True)):
            full_mib = memory(args.model, False, args.rank, args.steps, args.threads, ckpt)
            loads.append(load())
            lora_mib = memory(args.model, True, args.rank, args.steps, args.threads, ckpt)
            loads.append(load())
            ratio = lora_mib / full_mib
            out.update(
                {
                    f"{prefix}_full_mib": full_mib,
                    f"{prefix}_lora_mib": lora_mib,
                    f"{prefix}_ratio": ratio,
                }
            )
            how = "gradient checkpointing" if ckpt else "the task's settings"
            print(
                f"learner peak RSS ({how}): {lora_mib:.0f} MiB vs {full_mib:.0f} MiB ({ratio:.3f}x)"
            )
    if "engine" in parts:
        merged_s, layered_s = engine_rounds(args.model, args.rank, args.prompts, args.rounds)
        loads.append(load())
        out.update(
            engine_merged_s=merged_s,
            engine_unmerged_s=layered_s,
            engine_unmerged_over_merged=layered_s / merged_s,
        )
        print(
            f"engine round: merged {merged_s:.3f} s, peft layers {layered_s:.3f} s "
            f"({layered_s / merged_s:.3f}x)"
        )
    out["load_avg_1min"] = {
        "min": min(loads),
        "median": statistics.median(loads),
        "max": max(loads),
    }
    print(f"load (1 min): {out['load_avg_1min']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
