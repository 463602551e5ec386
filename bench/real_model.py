"""The real-model example's two costs against plain transformers, same rows, same run.

    python bench/real_model.py --model models/smollm2-135m-instruct --json out.json

On the documented example (docs/real_model.md: SmolLM2-135M-Instruct, its chat-templated
capital questions, `prompts_per_step` groups of G completions of at most `max_new_tokens`,
temperature 1, all from docs/real_model/smollm2.toml), float32 on the CPU, `--threads` torch
threads for everything:
- generation. ours: `HFEngine` with one `generate` call per group, all in flight at once (what a
  producer holding that many leases does): one batch, exact sampling log-probs, a random stream
  per lease, rows leaving at their first stop token. baseline: one batched
  `model.generate(do_sample=True)` of the same prompts x G rows, left-padded, stopping at the
  same stop tokens (no per-token log-probs). Wall and CPU time (`time.process_time`: every
  thread of this process).
- learner step. ours: `DeviceTrainer.step` on the groups our engine sampled (advantages,
  micro-batches, the chunked log-prob head over the 49,152-token vocabulary, the TIS-GRPO loss,
  metrics, clipping, AdamW). baseline: bench/learner_step.py's bare step on the same rows (a
  padded forward, log-softmax at the completion positions, mean, backward, clipping, AdamW) on
  a second copy of the model.
- generation in a closed loop (`--loop-groups`, default 48: what a producer does through a run):
  ours, `--in-flight` leases (16: a producer's share on 2 cores) awaited together and a new one
  started as each ends, so prompts join the rows decoding (refills for dropped groups, prompts
  of the task's different lengths, rows that stop early, the prompts' common prefix cached once
  per weights version: producer/engines/hf_prefix.py); baseline: the same prompts through
  batched `generate` calls of `--in-flight` prompts x G rows each. CPU seconds per group.
Generation first (both models, then freed), then the two learner copies: each round runs the
baseline then ours, after one warm-up round; medians are reported. Other work
shares this CPU: the 1-minute load average is recorded before every round (`load_avg_1min`:
min, median, max) and printed; compare ratios, not seconds, across runs.

JSON keys (stable): generate_wall_s, engine_wall_s, engine_over_generate_wall, generate_cpu_s,
engine_cpu_s, engine_over_generate_cpu, loop_engine_cpu_per_group,
loop_generate_cpu_per_group, loop_engine_over_generate_cpu, prefix_tokens, bare_step_s,
ours_step_s, ours_over_bare_step, rows, prompt_tokens_mean, completion_tokens_mean, vocab_size,
threads, repeats, load_avg_1min.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from learner_step import bare_rows, bare_step

from common import config as C
from common import wire
from consumer.data.sources import load_rows
from consumer.train.trainer import DeviceTrainer
from producer.engines.base import Completion, SamplingParams
from producer.engines.hf import HFEngine
from producer.tokenizer import PromptCodec

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "docs" / "real_model" / "smollm2.toml"


def load_avg() -> float:
    return os.getloadavg()[0]


def timed(fn: Any) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds of the process, result) of one call."""
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - w0, time.process_time() - c0, out


def prompts(cfg: C.Config, codec: PromptCodec, count: int) -> list[list[int]]:
    """The task's first `count` prompts (the config's task, as leased), rendered as producers
    render them."""
    rows = load_rows(cfg.task)
    picked = [rows[i % len(rows)] for i in range(count)]
    return [codec.encode(r.messages or r.prompt) for r in picked]


def engine_round(
    engine: HFEngine, batch: list[list[int]], cfg: C.Config, stops: tuple[int, ...], seed: int
) -> list[list[Completion]]:
    s = cfg.sampling

    async def all_groups() -> list[list[Completion]]:
        calls = [
            engine.generate(
                p,
                SamplingParams(
                    n=s.group_size,
                    temperature=s.temperature,
                    max_new_tokens=s.max_new_tokens,
                    seed=seed * 1000 + i,
                    stop_token_ids=stops,
                ),
            )
            for i, p in enumerate(batch)
        ]
        return list(await asyncio.gather(*calls))

    return asyncio.run(all_groups())


def generate_round(
    model: Any, batch: list[list[int]], cfg: C.Config, stops: tuple[int, ...]
) -> Any:
    g, width = cfg.sampling.group_size, max(len(p) for p in batch)
    ids = torch.tensor([[stops[0]] * (width - len(p)) + p for p in batch for _ in range(g)])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch for _ in range(g)])
    with torch.inference_mode():
        return model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=cfg.sampling.temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=cfg.sampling.max_new_tokens,
            pad_token_id=stops[0],
            eos_token_id=list(stops),
        )


def groups_of(
    batch: list[list[int]], sampled: list[list[Completion]], t: float
) -> list[wire.Group]:
    out = []
    for i, (prompt, completions) in enumerate(zip(batch, sampled, strict=True)):
        rewards = np.arange(len(completions)) % 2  # a signal in every group
        out.append(
            wire.Group(
                lease_id=i,
                producer_id="b",
                prompt_index=i,
                behavior_version=0,
                prompt_ids=np.array(prompt, np.int32),
                completion_ids=np.concatenate([c.token_ids for c in completions]),
                completion_lens=np.array([len(c.token_ids) for c in completions], np.int32),
                behavior_logp=np.concatenate([c.logprobs for c in completions]),
                token_versions=np.zeros(0, np.int32),
                rewards=rewards.astype(np.float32),
                finish_reasons=tuple(c.finish_reason for c in completions),
                temperature=t,
            )
        )
    return out


def generation_rounds(
    args: argparse.Namespace, cfg: C.Config
) -> tuple[dict[str, list[float]], list[list[int]], list[list[Completion]], int, tuple[int, ...]]:
    """Timed rounds of plain `generate` then our engine (round 0 warms up); the models are
    freed on return, before the learner's two copies and their optimizer states are built."""
    from transformers import AutoModelForCausalLM

    engine = HFEngine(args.model, device="cpu", seed=0)
    codec = PromptCodec(args.model, cfg.task.prompt_format, vocab_size=engine.vocab_size)
    batch = prompts(cfg, codec, cfg.train.prompts_per_step)
    plain = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    plain.eval()  # type: ignore[no-untyped-call]
    res: dict[str, list[float]] = {
        k: []
        for k in (
            "generate_wall_s",
            "generate_cpu_s",
            "engine_wall_s",
            "engine_cpu_s",
            "load_avg_1min",
        )
    }
    sampled: list[list[Completion]] = []
    for r in range(args.repeats + 1):
        load = load_avg()
        gen_w, gen_c, _ = timed(lambda: generate_round(plain, batch, cfg, codec.stop_ids))
        eng_w, eng_c, sampled = timed(
            lambda: engine_round(engine, batch, cfg, codec.stop_ids, seed=r)  # noqa: B023
        )
        print(
            json.dumps(
                {
                    "round": r,
                    "load": round(load, 2),
                    "generate_wall_s": round(gen_w, 2),
                    "engine_wall_s": round(eng_w, 2),
                }
            ),
            flush=True,
        )
        if r:
            for k, v in zip(res, (gen_w, gen_c, eng_w, eng_c, load), strict=True):
                res[k].append(v)
    asyncio.run(engine.close())
    return res, batch, sampled, engine.vocab_size, codec.stop_ids


def loop_round(args: argparse.Namespace, cfg: C.Config) -> tuple[dict[str, float], int]:
    """The closed loop (module docstring): CPU seconds per group, ours and plain `generate`;
    and the prefix our engine cached."""
    from transformers import AutoModelForCausalLM

    engine = HFEngine(args.model, device="cpu", seed=0)
    codec = PromptCodec(args.model, cfg.task.prompt_format, vocab_size=engine.vocab_size)
    batch = prompts(cfg, codec, args.loop_groups)
    s = cfg.sampling

    async def loop() -> None:
        slots = asyncio.Semaphore(args.in_flight)

        async def one(i: int) -> None:
            async with slots:
                params = SamplingParams(
                    n=s.group_size,
                    temperature=s.temperature,
                    max_new_tokens=s.max_new_tokens,
                    seed=i,
                    stop_token_ids=codec.stop_ids,
                )
                await engine.generate(batch[i], params)

        await asyncio.gather(*(one(i) for i in range(len(batch))))

    asyncio.run(loop())  # warm-up: the prefix is learned, the threads made
    _, ours_cpu, _ = timed(lambda: asyncio.run(loop()))
    prefix = len(engine.batch.prefix.ids)
    asyncio.run(engine.close())
    plain = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    plain.eval()  # type: ignore[no-untyped-call]
    parts = [batch[i : i + args.in_flight] for i in range(0, len(batch), args.in_flight)]
    _, plain_cpu, _ = timed(
        lambda: [generate_round(plain, part, cfg, codec.stop_ids) for part in parts]
    )
    n = len(batch)
    return {
        "loop_engine_cpu_per_group": ours_cpu / n,
        "loop_generate_cpu_per_group": plain_cpu / n,
    }, prefix


def step_rounds(
    args: argparse.Namespace, cfg: C.Config, groups: list[wire.Group]
) -> dict[str, list[float]]:
    """Timed rounds of the bare step then ours on the same groups (round 0 warms up)."""
    from transformers import AutoModelForCausalLM

    trainer = DeviceTrainer(cfg, args.model)
    bare = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    bare_opt = torch.optim.AdamW(bare.parameters(), lr=cfg.train.lr, betas=(0.9, 0.99))
    rows = bare_rows(groups)
    res: dict[str, list[float]] = {"bare_step_s": [], "ours_step_s": [], "load_avg_1min": []}
    for r in range(args.repeats + 1):
        load = load_avg()
        bare_s, _, _ = timed(
            lambda: bare_step(
                bare,
                bare_opt,
                rows,
                budget=cfg.train.micro_batch_tokens,
                device=torch.device("cpu"),
                autocast=False,
            )
        )
        ours_s, _, _ = timed(lambda: trainer.step(groups))
        print(
            json.dumps(
                {
                    "round": r,
                    "load": round(load, 2),
                    "bare_step_s": round(bare_s, 2),
                    "ours_step_s": round(ours_s, 2),
                }
            ),
            flush=True,
        )
        if r:
            for k, v in zip(res, (bare_s, ours_s, load), strict=True):
                res[k].append(v)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="the converted model directory")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--loop-groups", type=int, default=48, help="groups of the closed loop")
    ap.add_argument("--in-flight", type=int, default=16, help="leases in flight in the loop")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = C.override(C.load(CONFIG), {"model.path": str(args.model), "model.device": "cpu"})
    gen, batch, sampled, vocab, _ = generation_rounds(args, cfg)
    loop, prefix = loop_round(args, cfg)
    step = step_rounds(args, cfg, groups_of(batch, sampled, cfg.sampling.temperature))
    loads = gen.pop("load_avg_1min") + step.pop("load_avg_1min")
    med = {k: statistics.median(v) for k, v in {**gen, **step}.items()}
    lens = [len(c.token_ids) for cs in sampled for c in cs]
    out: dict[str, Any] = {
        **med,
        "engine_over_generate_wall": med["engine_wall_s"] / med["generate_wall_s"],
        "engine_over_generate_cpu": med["engine_cpu_s"] / med["generate_cpu_s"],
        "ours_over_bare_step": med["ours_step_s"] / med["bare_step_s"],
        **loop,
        "loop_engine_over_generate_cpu": (
            loop["loop_engine_cpu_per_group"] / loop["loop_generate_cpu_per_group"]
        ),
        "prefix_tokens": prefix,
        "rows": len(lens),
        "prompt_tokens_mean": float(np.mean([len(p) for p in batch])),
        "completion_tokens_mean": float(np.mean(lens)),
        "vocab_size": vocab,
        "threads": args.threads,
        "repeats": args.repeats,
        "load_avg_1min": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
    }
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
