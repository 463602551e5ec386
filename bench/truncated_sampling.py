"""Truncated sampling on the demo: the importance ratio with and without the kept set, and what
carrying the sets costs on the wire, in the decoder and in the learner step.

    python bench/truncated_sampling.py [--json PATH] [--steps 5] [--repeats 30]

1. Ratios at max_staleness 0 (`cases`: top_p 0.9, top_k 8). The demo model samples with the hf
   engine (8 prompts of the synthetic task × G 8, the demo config), the learner
   (`DeviceTrainer`, the same weights: nothing between them) computes each token's log-prob
   renormalised over the kept set the engine recorded, and over the full vocabulary on the same
   tokens; then it takes its step, and the engine loads the new weights for the next round
   (`--steps` rounds). Per token: ratio = exp(learner - behaviour). With the kept set it is 1 up
   to float rounding; the full-vocabulary one is S, the kept mass, below 1.
2. Wire (`wire`): encoded bytes per completion token of groups sampled at top_k 20 (the demo,
   whose 18-token vocabulary makes every set the whole vocabulary, 18 ids) and of a G 8 × 256-
   token group over a 150k vocabulary with top_k 20, against the same groups untruncated, and
   the budget 8 B per token + 4 B per kept id.
3. Decode (`decode_ratio_top_k_20`): `wire.decode` of the same group with and without its kept
   sets (run limits checking them), median of interleaved timings; demo and large group.
4. Learner step (`learner_step_ratio_top_k_20`): `DeviceTrainer.step` on the top_k 20 demo
   groups with their kept sets and the same groups without, alternated, medians over
   `--repeats` steps each.

Top-level keys: ratio_mean_kept_set, ratio_max_abs_dev_kept_set, ratio_mean_full_vocab (the top_p
0.9 case; both cases under `cases`), wire_bytes_per_token, wire_budget_bytes_per_token (the
demo's groups), wire_bytes_per_token_large, wire_budget_bytes_per_token_large,
wire_extra_bytes_per_kept_id (the large group; kept ids counted with the sampled one),
decode_ratio_top_k_20, learner_step_ratio_top_k_20, load averages at start and end.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from safetensors.torch import save_file

from common import config as C
from common import wire
from common.sampling import kept_set
from common.sampling.kept_set import Truncation
from common.task.synthetic import is_correct, make_examples
from consumer.train.trainer import DeviceTrainer
from launch.demo_model import ensure_demo_model
from producer.engines.base import SamplingParams
from producer.engines.hf import HFEngine
from producer.tokenizer import PromptCodec

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "launch" / "configs" / "demo.toml"
CASES = {"top_p_0.9": Truncation(top_p=0.9), "top_k_8": Truncation(top_k=8)}
TOP_K_20 = Truncation(top_k=20)


def config(truncation: Truncation) -> C.Config:
    cfg = C.load(DEMO_CONFIG)
    return C.override(
        cfg,
        {
            "model.device": "cpu",
            "model.torch_threads": 1,
            "staleness.max_staleness": 0,
            "sampling.top_k": truncation.top_k,
            "sampling.top_p": truncation.top_p,
            "sampling.min_p": truncation.min_p,
        },
    )


def untruncated(g: wire.Group) -> wire.Group:
    empty = np.zeros(0, np.int32)
    no_counts = np.zeros(0, np.uint8)
    return dataclasses.replace(g, kept_counts=no_counts, kept_ids=empty, kept_unknown=empty)


class Sampler:
    """The hf engine on the demo model, groups of the synthetic task's next prompts."""

    def __init__(self, model_dir: Path, cfg: C.Config, truncation: Truncation) -> None:
        self.cfg, self.truncation = cfg, truncation
        self.engine = HFEngine(model_dir, device="cpu", seed=0)
        self.codec = PromptCodec(model_dir, "raw", vocab_size=self.engine.vocab_size)
        self.examples = make_examples("train", 10_000, seed=0)
        self.next = 0

    async def groups(self, n: int) -> list[wire.Group]:
        s = self.cfg.sampling
        picked = self.examples[self.next : self.next + n]
        self.next += n
        prompts = [self.codec.encode(e.prompt) for e in picked]
        params = [
            SamplingParams(
                n=s.group_size, temperature=s.temperature, max_new_tokens=s.max_new_tokens,
                seed=self.next * 1000 + i, stop_token_ids=self.codec.stop_ids,
                truncation=self.truncation,
            )
            for i in range(n)
        ]  # fmt: skip
        calls = [self.engine.generate(p, q) for p, q in zip(prompts, params, strict=True)]
        outs = await asyncio.gather(*calls)
        trios = zip(prompts, picked, outs, strict=True)
        return [self._group(i, p, e.answer, c) for i, (p, e, c) in enumerate(trios)]

    def _group(self, i: int, prompt: list[int], answer: str, completions: list[Any]) -> wire.Group:
        lens = [len(c.token_ids) for c in completions]
        kept = kept_set.concat([c.kept for c in completions], lens)
        rewards = [float(is_correct(self.codec.decode(c.token_ids), answer)) for c in completions]
        return wire.Group(
            lease_id=self.next * 100 + i, producer_id="bench", prompt_index=i,
            behavior_version=max(self.engine.version, 0), prompt_ids=np.array(prompt, np.int32),
            completion_ids=np.concatenate([c.token_ids for c in completions]),
            completion_lens=np.array(lens, np.int32),
            behavior_logp=np.concatenate([c.logprobs for c in completions]),
            token_versions=np.zeros(0, np.int32), rewards=np.array(rewards, np.float32),
            finish_reasons=tuple(c.finish_reason for c in completions),
            temperature=self.cfg.sampling.temperature, kept_counts=kept.other_counts(),
            kept_ids=kept.ids, kept_unknown=kept.unknown,
        )  # fmt: skip


async def ratios(model_dir: Path, truncation: Truncation, steps: int) -> dict[str, Any]:
    """Section 1 for one truncation: per-token ratios over `steps` rounds at max_staleness 0."""
    cfg = config(truncation)
    torch.set_num_threads(1)
    trainer = DeviceTrainer(cfg, model_dir)
    sampler = Sampler(model_dir, cfg, truncation)
    kept_r, full_r, sizes = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for step in range(steps):
                snapshot = Path(tmp) / f"v{step}"
                snapshot.mkdir()
                weights = {k: v.detach().clone().contiguous() for k, v in trainer.weights().items()}
                weights.pop("lm_head.weight", None)  # tied: the engine follows the embeddings
                save_file(weights, snapshot / "model.safetensors")
                await sampler.engine.load_weights(snapshot, step)
                groups = await sampler.groups(cfg.train.prompts_per_step)
                behaviour = np.concatenate([g.behavior_logp for g in groups]).astype(np.float64)
                learner = np.concatenate(trainer.logprobs(groups)).astype(np.float64)
                naive = np.concatenate(trainer.logprobs([untruncated(g) for g in groups]))
                kept_r.append(np.exp(learner - behaviour))
                full_r.append(np.exp(naive.astype(np.float64) - behaviour))
                sizes += [g.kept.sizes() for g in groups]
                trainer.step(groups)
        finally:
            await sampler.engine.close()
    k, f, sz = np.concatenate(kept_r), np.concatenate(full_r), np.concatenate(sizes)
    return {
        "tokens": len(k),
        "ratio_mean_kept_set": float(k.mean()),
        "ratio_max_abs_dev_kept_set": float(np.abs(k - 1).max()),
        "ratio_mean_full_vocab": float(f.mean()),
        "ratio_min_full_vocab": float(f.min()),
        "ratio_out_of_band_kept_set": _out_of_band(k),
        "ratio_out_of_band_full_vocab": _out_of_band(f),
        "kept_size_mean": float(sz.mean()),
        "kept_mass_mean": float(f.mean()),  # exp(full - behaviour) = S at equal weights
    }


def _out_of_band(ratios: np.ndarray) -> float:
    """The share of per-token ratios outside [0.9, 1.1]."""
    return float(((ratios < 0.9) | (ratios > 1.1)).mean())


def _timed(fn: Any, repeats: int) -> float:
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def wire_and_decode(groups: list[wire.Group], limits: wire.Limits) -> dict[str, Any]:
    """Sections 2 and 3 for these groups (all with kept sets) against their untruncated selves."""
    plain = [untruncated(g) for g in groups]
    data = [wire.encode(g) for g in groups]
    data_plain = [wire.encode(g) for g in plain]
    tokens = sum(g.num_tokens for g in groups)
    kept_ids = int(sum(g.kept.sizes().sum() for g in groups))
    trunc_limits = limits
    plain_limits = dataclasses.replace(limits, max_kept=0)
    for d in data:
        wire.decode(d, trunc_limits)  # they are valid
    reps = max(1, 20_000 // max(len(data), 1) // max(1, tokens // (100 * len(data))))
    t_kept, t_plain = [], []
    for _ in range(9):  # interleaved rounds; medians
        t_plain.append(_timed(lambda: [wire.decode(d, plain_limits) for d in data_plain], reps))
        t_kept.append(_timed(lambda: [wire.decode(d, trunc_limits) for d in data], reps))
    per_group = 1e6 / len(data)
    kept_us, plain_us = (
        statistics.median(t_kept) * per_group,
        statistics.median(t_plain) * per_group,
    )
    total, total_plain = sum(map(len, data)), sum(map(len, data_plain))
    return {
        "groups": len(groups),
        "tokens": tokens,
        "kept_ids": kept_ids,
        "kept_ids_per_token": kept_ids / tokens,
        "bytes_per_token": total / tokens,
        "bytes_per_token_untruncated": total_plain / tokens,
        "budget_bytes_per_token": (8 * tokens + 4 * kept_ids) / tokens,
        "extra_bytes_per_kept_id": (total - total_plain) / kept_ids,
        "decode_us_per_group": kept_us,
        "decode_us_per_group_untruncated": plain_us,
        "decode_ratio": kept_us / plain_us,
    }


def large_groups(n: int = 4, G: int = 8, L: int = 256, vocab: int = 150_000) -> list[wire.Group]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        tokens = rng.integers(0, vocab, G * L, dtype=np.int32)
        others = [np.sort(np.setdiff1d(rng.choice(vocab, 20, replace=False), [t])[:19])
                  for t in tokens]  # fmt: skip
        kept = kept_set.from_lists([o.astype(np.int32) for o in others])
        out.append(wire.Group(
            lease_id=i, producer_id="host-12345", prompt_index=i, behavior_version=41,
            prompt_ids=rng.integers(0, vocab, 64, dtype=np.int32), completion_ids=tokens,
            completion_lens=np.full(G, L, np.int32),
            behavior_logp=-rng.random(G * L, dtype=np.float32),
            token_versions=np.zeros(0, np.int32), rewards=rng.random(G, dtype=np.float32),
            finish_reasons=("length",) * G, temperature=1.0, kept_counts=kept.other_counts(),
            kept_ids=kept.ids,
        ))  # fmt: skip
    return out


def learner_steps(model_dir: Path, groups: list[wire.Group], repeats: int) -> dict[str, Any]:
    """Section 4: the step on the same groups with and without their kept sets, alternated."""
    torch.set_num_threads(1)
    trainer = DeviceTrainer(config(TOP_K_20), model_dir)
    plain = [untruncated(g) for g in groups]
    for _ in range(3):  # warm-up
        trainer.step(groups)
        trainer.step(plain)
    t_kept, t_plain = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        trainer.step(plain)
        t_plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        trainer.step(groups)
        t_kept.append(time.perf_counter() - t0)
    kept_ms, plain_ms = 1e3 * statistics.median(t_kept), 1e3 * statistics.median(t_plain)
    return {"step_ms": kept_ms, "step_ms_untruncated": plain_ms, "ratio": kept_ms / plain_ms}


async def sample_top_k_20(model_dir: Path) -> list[wire.Group]:
    sampler = Sampler(model_dir, config(TOP_K_20), TOP_K_20)
    try:
        await sampler.engine.load_weights(model_dir, 0)
        return await sampler.groups(8)
    finally:
        await sampler.engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=5, help="rounds of sample -> ratio -> step")
    ap.add_argument("--repeats", type=int, default=30, help="learner steps timed per variant")
    args = ap.parse_args()
    load_start = os.getloadavg()
    model_dir = ensure_demo_model()
    out: dict[str, Any] = {"cases": {}}
    for name, truncation in CASES.items():
        out["cases"][name] = asyncio.run(ratios(model_dir, truncation, args.steps))
        print(name, json.dumps(out["cases"][name]), flush=True)
    keys = ("ratio_mean_kept_set", "ratio_max_abs_dev_kept_set", "ratio_mean_full_vocab")
    out.update({k: out["cases"]["top_p_0.9"][k] for k in keys})
    demo = asyncio.run(sample_top_k_20(model_dir))
    vocab = demo[0].kept.sizes().max()  # every set is the whole vocabulary here
    demo_limits = wire.Limits(vocab_size=18, group_size=8, temperature=1.0, max_kept=256)
    big_limits = wire.Limits(vocab_size=150_000, group_size=8, temperature=1.0, max_kept=256)
    out["wire"] = {
        "demo_top_k_20": wire_and_decode(demo, demo_limits),
        "large_top_k_20": wire_and_decode(large_groups(), big_limits),
    }
    print("wire", json.dumps(out["wire"]), flush=True)
    d, large = out["wire"]["demo_top_k_20"], out["wire"]["large_top_k_20"]
    out.update(
        wire_bytes_per_token=d["bytes_per_token"],
        wire_budget_bytes_per_token=d["budget_bytes_per_token"],
        wire_bytes_per_token_large=large["bytes_per_token"],
        wire_budget_bytes_per_token_large=large["budget_bytes_per_token"],
        wire_extra_bytes_per_kept_id=large["extra_bytes_per_kept_id"],
        decode_ratio_top_k_20=d["decode_ratio"],
        demo_kept_set_size=int(vocab),
    )
    out["learner_step_top_k_20"] = learner_steps(model_dir, demo, args.repeats)
    out["learner_step_ratio_top_k_20"] = out["learner_step_top_k_20"]["ratio"]
    out["load_avg_start"], out["load_avg_end"] = list(load_start), list(os.getloadavg())
    out["cpus"] = len(os.sched_getaffinity(0))
    print(json.dumps(out, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
