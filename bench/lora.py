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
- memory (`mem_*`): the learner's peak RSS, full fine-tune against LoRA, each measured by
  bench/learner_memory.py in a fresh process (the peak resident set, VmHWM, of one process
  holding the learner's `DeviceTrainer` and its `Publisher`, as the consumer does): `--steps`
  optimizer steps of the `--config` task (default docs/real_model/smollm2.toml: its prompts
  rendered with the chat template, its batch of 8 prompts x G 4 at the longest completions,
  its learner settings), a snapshot published after each; same seed, same batches for both.
  With the task's settings (`mem_*`) and with `model.gradient_checkpointing` on for both
  (`mem_ckpt_*`); `*_owners` splits each peak by owner (baseline, weights, reference model,
  grads, optimizer, host snapshot buffers, activations, allocator slack: see
  bench/learner_memory.py). `--malloc` as there (`default`: consumer/train/host_memory.py's
  1 MiB mmap threshold; `glibc`: glibc's own thresholds).
- engine (`engine_*`): the hf engine's two ways to sample with an adapter, on the same prompts
  and seeds: merged into the weights (what the engine does: producer/engines/hf_adapter.py) and
  peft's LoRA layers in the engine's model (the adapter applied at every token). Wall time of
  one round of `--prompts` groups of G 4, medians over rounds run alternately.

- exactness (`exact_*`): at max_staleness 0, the hf engine's behaviour log-probs against the
  learner's, after 2 LoRA updates (lr 2e-4) on the `--config` task: the learner publishes
  version 2, an engine loads it and samples `--exact-prompts` of the task's prompts (G and
  length as the task's), the learner scores them: max and mean |difference| over the tokens
  (`exact_lora_*`), and the base model's (`exact_base_*`: an engine without the adapter, the
  learner with it off), and with the engine applying peft's layers unmerged instead of merging
  (`exact_unmerged_*`). Where a difference comes from: the learner against itself, each group
  alone against all groups in one forward (`exact_learner_self_*`); the engine against itself
  with every prompt prefilled whole instead of after the shared prefix's cache
  (`exact_engine_self_*`, None if that sampled other tokens); and each side's base log-probs
  against a float64 forward of the same weights, each row alone (`exact_engine_f64_*`,
  `exact_learner_f64_*`), and the same for the adapter's (`exact_lora_engine_f64_*`,
  `exact_lora_learner_f64_*`: peft's layers in float64 on the float64 base). `exact_tokens`:
  the tokens compared.

JSON keys (stable): pub_full_bytes, pub_lora_bytes, pub_bytes_ratio, pub_full_s, pub_lora_s,
pub_latency_ratio, mem_full_mib, mem_lora_mib, mem_ratio, mem_owners ({full, lora} -> owner ->
MiB), mem_ckpt_full_mib, mem_ckpt_lora_mib, mem_ckpt_ratio, mem_ckpt_owners, mem_malloc,
exact_tokens, exact_lora_max, exact_lora_mean, exact_base_max, exact_base_mean,
exact_learner_self_max, exact_learner_self_mean, exact_engine_self_max, exact_engine_self_mean,
exact_engine_f64_max, exact_engine_f64_mean, exact_learner_f64_max, exact_learner_f64_mean,
exact_unmerged_max, exact_unmerged_mean, exact_lora_engine_f64_max, exact_lora_engine_f64_mean,
exact_lora_learner_f64_max, exact_lora_learner_f64_mean,
engine_merged_s, engine_unmerged_s, engine_unmerged_over_merged, rank, trainable_params,
total_params, threads, load_avg_1min.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # learner_memory.py, real_model.py

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
OWNERS = (
    ("baseline_mb", "baseline (imports, tokenizer)"),
    ("weights_mb", "weights (LoRA: the frozen base + the adapter)"),
    ("reference_model_mb", "reference model"),
    ("grads_mb", "grads"),
    ("optimizer_mb", "optimizer (AdamW moments)"),
    ("host_buffer_mb", "host snapshot buffers"),
    ("activations_mb", "activations and logits (peak in use)"),
    ("slack_mb", "allocator slack and the rest"),
    ("peak_rss_mb", "peak RSS"),
)


def memory(
    model: Path,
    config: Path,
    lora: bool,
    *,
    rank: int,
    steps: int,
    threads: int,
    checkpointing: bool,
    malloc: str,
) -> dict[str, Any]:
    """bench/learner_memory.py in a fresh process (the learner's trainer and publisher, the
    config's task): its figures, the peak RSS by owner."""
    with tempfile.TemporaryDirectory(prefix="bench-lora-mem-") as tmp:
        out = Path(tmp) / "memory.json"
        args = [sys.executable, str(ROOT / "bench" / "learner_memory.py"), "--model", str(model)]
        args += ["--config", str(config), "--steps", str(steps), "--threads", str(threads)]
        args += ["--malloc", malloc, "--json", str(out)]
        for key, value in (
            ("model.lora.enabled", lora),
            ("model.lora.rank", rank),
            ("model.gradient_checkpointing", checkpointing),
        ):
            args += ["--set", f"{key}={str(value).lower()}"]
        subprocess.run(args, capture_output=True, text=True, check=True)
        figures: dict[str, Any] = json.loads(out.read_text())
    return figures


def owners_table(full: dict[str, Any], lora: dict[str, Any]) -> str:
    lines = [f"{'MiB':44} {'full':>8} {'LoRA':>8}"]
    lines += [f"{name:44} {full[key]:8.0f} {lora[key]:8.0f}" for key, name in OWNERS]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ engine
def with_peft_layers(model_obj: Any, directory: Path) -> None:
    """peft's LoRA layers put into `model_obj` (in its dtype), A and B copied in from the
    snapshot in `directory`: the adapter applied at every token, unmerged."""
    import peft
    from safetensors import safe_open

    from common.weights import adapter as fmt

    header = fmt.read_header(directory / snap.WEIGHTS_FILE)
    assert header is not None
    spec = header.spec
    lora = peft.LoraConfig(
        r=spec.rank, lora_alpha=int(spec.alpha), target_modules=spec.target_modules
    )
    peft.inject_adapter_in_model(lora, model_obj)
    dtype = next(model_obj.parameters()).dtype
    with torch.no_grad(), safe_open(str(directory / snap.WEIGHTS_FILE), "pt") as f:
        for name, layer in model_obj.named_modules():
            if isinstance(layer, peft.tuners.lora.LoraLayer):
                module: Any = layer
                a, b = fmt.tensor_names(name)
                module.lora_A["default"].weight.copy_(f.get_tensor(a).to(dtype))
                module.lora_B["default"].weight.copy_(f.get_tensor(b).to(dtype))
    model_obj.eval()


def engine_rounds(model: Path, rank: int, prompts: int, rounds: int) -> tuple[float, float]:
    """Median seconds of one round of `prompts` groups: (merged, peft layers)."""

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
    rng = np.random.default_rng(0)
    vocab = trainer.vocab_size
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
        with_peft_layers(layered.model, directory)
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


# ------------------------------------------------------------------------------ exactness
def _gap(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(d.max()), float(d.mean())


def exactness(model: Path, config: Path, rank: int, prompts: int) -> dict[str, Any]:
    """Behaviour log-probs against the learner's at max_staleness 0, after 2 LoRA updates, and
    where the difference comes from: each side against itself at another batch shape, and the
    base model's (adapter off) against a float64 forward of the same weights."""
    import learner_memory as LM
    from real_model import groups_of

    from consumer.snapshots.publisher import Publisher
    from consumer.train import adapter as LA
    from consumer.train.trainer import DeviceTrainer
    from producer.engines.base import SamplingParams
    from producer.engines.hf import HFEngine
    from producer.engines.hf_prefix import PrefixCache

    values = {"model.path": str(model), "model.device": "cpu", "train.lr": 2e-4}
    values |= {"model.lora.enabled": True, "model.lora.rank": rank}
    cfg = C.override(C.load(config), values)
    trainer = DeviceTrainer(cfg, model)
    for batch in LM.task_groups(cfg, model, trainer.vocab_size, seed=0)[:2]:  # 2 updates
        trainer.step(batch)
    infos: list[wire.SnapshotInfo] = []
    root = Path(tempfile.mkdtemp(prefix="bench-lora-exact-"))
    pub = Publisher(root, model, keep_last=1, on_published=infos.append, adapter=trainer.adapter)
    pub.submit(trainer.weights(), version=2, step=2, dtype=torch.float32)
    pub.close()
    rows = LM.task_groups(cfg, model, trainer.vocab_size, seed=0)[2][:prompts]
    ids = [r.prompt_ids.tolist() for r in rows]
    T, G, n = cfg.sampling.temperature, cfg.sampling.group_size, cfg.sampling.max_new_tokens

    directory = Path(infos[-1].path).parent

    async def sample(adapter: bool, prefix: bool, merged: bool = True) -> list[wire.Group]:
        engine = HFEngine(model, device="cpu", seed=0)
        if adapter and merged:
            await engine.load_weights(directory, 2)
        elif adapter:
            with_peft_layers(engine.model, directory)
        if not prefix:  # every prompt prefilled whole (hf_prefix.py off)
            engine.batch.prefix = PrefixCache(min_tokens=1 << 30)
        try:
            params = [
                SamplingParams(n=G, temperature=T, max_new_tokens=n, seed=i)
                for i in range(len(ids))
            ]
            done = await asyncio.gather(
                *(engine.generate(p, s) for p, s in zip(ids, params, strict=True))
            )
        finally:
            await engine.close()
        return groups_of(ids, done, T)

    def behaviour(groups: list[wire.Group]) -> np.ndarray:
        return np.concatenate([g.behavior_logp for g in groups])

    def learner(groups: list[wire.Group], *, together: bool) -> np.ndarray:
        if together:
            return np.concatenate(trainer.logprobs(groups))
        return np.concatenate([x for g in groups for x in trainer.logprobs([g])])

    out: dict[str, Any] = {}
    lora = asyncio.run(sample(adapter=True, prefix=True))
    lora_noprefix = asyncio.run(sample(adapter=True, prefix=False))
    same = all(
        np.array_equal(a.completion_ids, b.completion_ids)
        for a, b in zip(lora, lora_noprefix, strict=True)
    )
    out["exact_tokens"] = int(sum(len(g.completion_ids) for g in lora))
    lora_learner = learner(lora, together=False)
    out["exact_lora_max"], out["exact_lora_mean"] = _gap(lora_learner, behaviour(lora))
    unmerged = asyncio.run(sample(adapter=True, prefix=True, merged=False))
    out["exact_unmerged_max"], out["exact_unmerged_mean"] = _gap(
        learner(unmerged, together=False), behaviour(unmerged)
    )
    out["exact_learner_self_max"], out["exact_learner_self_mean"] = _gap(
        learner(lora, together=False), learner(lora, together=True)
    )
    # the engine against itself, each prompt prefilled whole (other shapes; None: other tokens)
    out["exact_engine_self_max"], out["exact_engine_self_mean"] = (
        _gap(behaviour(lora), behaviour(lora_noprefix)) if same else (None, None)
    )
    base = asyncio.run(sample(adapter=False, prefix=True))
    with LA.disabled(trainer.model):
        base_learner = learner(base, together=False)
    out["exact_base_max"], out["exact_base_mean"] = _gap(base_learner, behaviour(base))
    # float64: the base's weights, each row's whole sequence in one forward
    from transformers import AutoModelForCausalLM

    def float64(m64: Any, groups: list[wire.Group]) -> np.ndarray:
        exact = []
        for g in groups:
            offsets = np.concatenate([[0], np.cumsum(g.completion_lens)])
            P = len(g.prompt_ids)
            for r in range(len(g.completion_lens)):
                tokens = torch.as_tensor(
                    g.completion_ids[offsets[r] : offsets[r + 1]], dtype=torch.long
                )
                row = torch.cat([torch.as_tensor(g.prompt_ids, dtype=torch.long), tokens])
                with torch.no_grad():
                    logits = m64(input_ids=row[None]).logits[0, P - 1 : P - 1 + len(tokens)]
                logp = torch.log_softmax(logits / T, -1).gather(-1, tokens[:, None])[:, 0]
                exact.append(logp.numpy())
        return np.concatenate(exact)

    m64: Any = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64)
    m64.eval()
    f64 = float64(m64, base)
    out["exact_engine_f64_max"], out["exact_engine_f64_mean"] = _gap(behaviour(base), f64)
    out["exact_learner_f64_max"], out["exact_learner_f64_mean"] = _gap(base_learner, f64)
    with_peft_layers(m64, directory)  # the adapter in float64 too
    f64 = float64(m64, lora)
    out["exact_lora_engine_f64_max"], out["exact_lora_engine_f64_mean"] = _gap(behaviour(lora), f64)
    out["exact_lora_learner_f64_max"], out["exact_lora_learner_f64_mean"] = _gap(lora_learner, f64)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2-135m-instruct")
    ap.add_argument("--rank", type=int, default=C.Config().model.lora.rank)
    ap.add_argument("--versions", type=int, default=5, help="publications timed per mode")
    ap.add_argument("--steps", type=int, default=3, help="learner steps in the memory part")
    ap.add_argument(
        "--config",
        type=Path,
        default=ROOT / "docs" / "real_model" / "smollm2.toml",
        help="the task the memory part trains (its prompts, batch and learner settings)",
    )
    ap.add_argument(
        "--malloc",
        choices=("default", "glibc"),
        default="default",
        help="the memory part's allocator setting (bench/learner_memory.py)",
    )
    ap.add_argument("--prompts", type=int, default=8, help="groups per engine round")
    ap.add_argument("--rounds", type=int, default=3, help="engine rounds per way")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--exact-prompts", type=int, default=4, help="prompts in the exact part")
    ap.add_argument("--parts", default="publication,memory,exact,engine")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
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
        out["mem_malloc"] = args.malloc
        for prefix, ckpt in (("mem", False), ("mem_ckpt", True)):
            figures = {}
            for mode in ("full", "lora"):
                figures[mode] = memory(
                    args.model,
                    args.config,
                    mode == "lora",
                    rank=args.rank,
                    steps=args.steps,
                    threads=args.threads,
                    checkpointing=ckpt,
                    malloc=args.malloc,
                )
                loads.append(load())
            full_mib, lora_mib = figures["full"]["peak_rss_mb"], figures["lora"]["peak_rss_mb"]
            ratio = lora_mib / full_mib
            out.update(
                {
                    f"{prefix}_full_mib": full_mib,
                    f"{prefix}_lora_mib": lora_mib,
                    f"{prefix}_ratio": ratio,
                    f"{prefix}_owners": {
                        mode: {key: figures[mode][key] for key, _ in OWNERS} for mode in figures
                    },
                }
            )
            how = "gradient checkpointing" if ckpt else "the task's settings"
            print(
                f"learner peak RSS ({how}): {lora_mib:.0f} MiB vs {full_mib:.0f} MiB ({ratio:.3f}x)"
            )
            print(owners_table(figures["full"], figures["lora"]))
    if "exact" in parts:
        out.update(exactness(args.model, args.config, args.rank, args.exact_prompts))
        loads.append(load())
        print(
            f"behaviour vs learner log-probs after 2 LoRA updates: max {out['exact_lora_max']:.2e}"
            f" (mean {out['exact_lora_mean']:.2e}, {out['exact_tokens']} tokens); base model "
            f"{out['exact_base_max']:.2e}; learner vs itself (other batch) "
            f"{out['exact_learner_self_max']:.2e}; engine vs itself (no prefix cache) "
            f"{out['exact_engine_self_max'] or float('nan'):.2e}; vs float64: engine "
            f"{out['exact_engine_f64_max']:.2e}, learner {out['exact_learner_f64_max']:.2e}; "
            f"with the adapter: unmerged engine vs learner {out['exact_unmerged_max']:.2e}, vs "
            f"float64: engine {out['exact_lora_engine_f64_max']:.2e}, learner "
            f"{out['exact_lora_learner_f64_max']:.2e}"
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
