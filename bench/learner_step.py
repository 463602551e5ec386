"""Learner step: `Trainer.step` vs a bare padded forward/backward/AdamW step, same batch, one run.

    python bench/learner_step.py                  # CPU, demo model, 8 x 8 rows of 6 + 5 tokens
    python bench/learner_step.py --device cuda --shape qwen05 --lengths equal,mix --json out.json
    python bench/learner_step.py --device cuda --shape qwen05 --lengths mix \\
        --micro-batch-tokens 65536 --gradient-checkpointing
    torchrun --nproc-per-node 1 bench/learner_step.py [--fsdp]   # world size 1 under torchrun

- baseline, the least any learner must do: rows sorted by length and cut into micro-batches of
  at most `--micro-batch-tokens` padded tokens, right-padded (an attention mask only where rows
  differ in length), the decoder forward, log-softmax of the completion positions only (float32,
  at the temperature), their mean as the loss, backward, gradient clipping, AdamW (fused on
  CUDA); bf16 autocast on CUDA.
- ours: `consumer.train.trainer.DeviceTrainer.step` on the same groups (advantages, micro-batch
  planning, packing, the chunked log-prob head, TIS-GRPO loss, metrics, clipping, AdamW), same
  settings.

Shapes: `demo` (the embedded demo model, built on first use) or `qwen05` (Qwen2.5-0.5B's shape,
random weights, built here: no download). Lengths: `equal` (every prompt `--prompt-tokens`,
every completion `--tokens`) or `mix` (per group one prompt length, per completion a log-normal
length with a long tail; qwen05: prompts 64-512, completions 32-1024, median 150). Steps
alternate baseline / ours after `--warmup` rounds; medians are reported.

Printed and written (`--json PATH`) per case: ms per step and tokens/s (real tokens, prompt +
completion, per second) of each, `speedup` = ours tokens/s over baseline's, `ratio` = ours ms
over baseline ms (the CPU figure docs/results.md quotes), peak memory of each step above what was
allocated before it (CUDA), the attention path, micro-batches and padding fraction of ours.
Under torchrun with one process, ours is what `asyncgrpo consumer` builds there (the one-device
`Trainer`: compare its ratio with a plain run's); `--fsdp` makes ours the FSDP2 learner alone in
a world of one (the sharding machinery with nothing to shard).
`--head-tokens N` (CUDA) also measures the log-prob/entropy part alone on N positions: peak
memory of the chunked head vs full-vocabulary float32 logits, forward and backward. A step that
runs out of memory is a result (`*_oom: true`, its figures null), not a crash. `--model DIR`
takes a model directory instead of building `--shape` (whose batch defaults still apply). In the
JSON a figure that does not exist (CPU peak memory, a step that ran out of memory) is null.
"""

from __future__ import annotations

import argparse
import contextlib
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import build_qwen05

from common import config as C
from common import wire
from consumer.train import make_trainer
from consumer.train.ranks import World
from consumer.train.sharded import ShardedTrainer
from consumer.train.trainer import DeviceTrainer

# per shape: defaults, and the length mix (prompt range, completion range and median)
SHAPES: dict[str, dict[str, Any]] = {
    "demo": dict(groups=8, prompt_tokens=6, tokens=5, repeats=30, mix=((5, 10), (1, 40), 6)),
    "qwen05": dict(
        groups=16, prompt_tokens=32, tokens=256, repeats=5, mix=((64, 512), (32, 1024), 150)
    ),
}


def groups(
    n: int, g: int, vocab: int, *, lengths: str, prompt_tokens: int, tokens: int, mix: Any,
    seed: int,
) -> list[wire.Group]:  # fmt: skip
    rng = np.random.default_rng(seed)
    (p_lo, p_hi), (c_lo, c_hi), median = mix
    out = []
    for i in range(n):
        if lengths == "equal":
            p, lens = prompt_tokens, np.full(g, tokens, np.int32)
        else:
            p = int(rng.integers(p_lo, p_hi + 1))
            lens = np.clip(np.exp(rng.normal(np.log(median), 0.8, g)), c_lo, c_hi).astype(np.int32)
        total = int(lens.sum())
        out.append(
            wire.Group(
                lease_id=i,
                producer_id="b",
                prompt_index=i,
                behavior_version=0,
                prompt_ids=rng.integers(2, vocab, p, dtype=np.int32),
                completion_ids=rng.integers(2, vocab, total, dtype=np.int32),
                completion_lens=lens,
                behavior_logp=np.full(total, -2.0, np.float32),
                token_versions=np.zeros(0, np.int32),
                rewards=(rng.random(g) < 0.5).astype(np.float32),
                finish_reasons=("length",) * g,
                temperature=1.0,
            )
        )
    return out


def bare_rows(batch: list[wire.Group]) -> list[tuple[np.ndarray, int]]:
    """(ids, prompt length) per completion."""
    return [
        (np.concatenate([g.prompt_ids, g.completion(i)[0]]).astype(np.int64), len(g.prompt_ids))
        for g in batch
        for i in range(g.group_size)
    ]


def bare_step(
    model: Any, opt: torch.optim.Optimizer, rows: list[tuple[np.ndarray, int]], *, budget: int,
    device: torch.device, autocast: bool,
) -> None:  # fmt: skip
    """Sorted, padded micro-batches; log-softmax at completion positions; mean; AdamW."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    plans: list[list[int]] = [[]]
    for i in order:  # ascending: the row joining is the longest
        if plans[-1] and (len(plans[-1]) + 1) * len(rows[i][0]) > budget:
            plans.append([])
        plans[-1].append(i)
    n_total = sum(len(ids) - p for ids, p in rows)
    opt.zero_grad(set_to_none=True)
    ctx = torch.autocast("cuda", torch.bfloat16) if autocast else contextlib.nullcontext()
    for plan in plans:
        L = max(len(rows[i][0]) for i in plan)
        ids = torch.zeros(len(plan), L, dtype=torch.long)
        keep = torch.zeros(len(plan), L, dtype=torch.bool)  # positions predicting completions
        lengths = []
        for b, i in enumerate(plan):
            row, p = rows[i]
            ids[b, : len(row)] = torch.from_numpy(row)
            keep[b, p - 1 : len(row) - 1] = True
            lengths.append(len(row))
        mask = None
        if len(set(lengths)) > 1:
            mask = (torch.arange(L)[None] < torch.tensor(lengths)[:, None]).long().to(device)
        ids, keep = ids.to(device), keep.to(device)
        targets = ids[:, 1:][keep[:, :-1]]
        with ctx:
            h = model.get_decoder()(input_ids=ids, attention_mask=mask, use_cache=False)
            logits = model.get_output_embeddings()(h.last_hidden_state[keep])
        logp = torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None])
        (-logp.sum() / n_total).backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def timed(fn: Any, device: torch.device) -> tuple[float, float]:
    """(seconds, peak bytes above what was allocated before) of one call."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return dt, (torch.cuda.max_memory_allocated() - base) if cuda else float("nan")


def head_memory(trainer: DeviceTrainer, n: int, device: torch.device) -> dict[str, float]:
    """Peak memory (MiB above the start) of log-probs + entropy + backward on n positions:
    the trainer's chunked head vs full float32 logits, bf16 matmul under autocast."""
    from common.sampling.logprobs import entropy_from_logits, sampled_logprobs
    from consumer.train.lm_head import chunked_logprobs

    head = trainer.model.get_output_embeddings()  # type: ignore[no-untyped-call]
    hidden = head.weight.shape[1]
    tokens = torch.randint(head.out_features, (n,), device=device)
    out: dict[str, float] = {"positions": n, "chunk_rows": trainer.policy.chunk_rows}

    def chunked() -> None:
        h = torch.randn(n, hidden, device=device, requires_grad=True)
        logp, _ = chunked_logprobs(
            h, head.weight, None, tokens, temperature=1.0,
            chunk_rows=trainer.policy.chunk_rows, compute_dtype=torch.bfloat16,
        )  # fmt: skip
        logp.sum().backward()  # type: ignore[no-untyped-call]

    def full() -> None:
        h = torch.randn(n, hidden, device=device, requires_grad=True)
        with torch.autocast("cuda", torch.bfloat16):
            logits = head(h).float()
        logp = sampled_logprobs(logits, tokens, temperature=1.0)
        with torch.no_grad():
            entropy_from_logits(logits, temperature=1.0)
        logp.sum().backward()  # type: ignore[no-untyped-call]

    for name, fn in (("chunked", chunked), ("full_logits", full)):
        try:
            dt, peak = timed(fn, device)
            out[f"{name}_peak_mib"], out[f"{name}_s"] = peak / 2**20, dt
            out[f"{name}_oom"] = False
        except torch.OutOfMemoryError:
            out[f"{name}_oom"] = True
        head.weight.grad = None
        torch.cuda.empty_cache()
    return out


def run_case(
    a: argparse.Namespace, model_dir: Path, lengths: str, device: torch.device
) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    shape = SHAPES[a.shape]
    sets = {
        "model.device": str(device),
        "model.path": str(model_dir),
        "model.dtype": a.dtype,
        "model.attention": a.attention,
        "model.compile": a.compile,
        "model.gradient_checkpointing": a.gradient_checkpointing,
        "train.micro_batch_tokens": a.micro_batch_tokens,
    }
    cfg = C.override(C.Config(), sets)
    if a.fsdp:  # the sharded learner alone in a world of one (torchrun --nproc-per-node 1)
        trainer: DeviceTrainer = ShardedTrainer(cfg, model_dir, World.from_env())
    else:  # what `asyncgrpo consumer` builds: the one-device DeviceTrainer at world size 1
        trainer = make_trainer(cfg, model_dir)
    n = a.groups or shape["groups"]
    batch = groups(
        n, a.group_size, trainer.vocab_size, lengths=lengths, seed=a.seed, mix=shape["mix"],
        prompt_tokens=a.prompt_tokens or shape["prompt_tokens"], tokens=a.tokens or shape["tokens"],
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = model.to(device)  # type: ignore[arg-type]
    if a.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    rows = bare_rows(batch)
    autocast = a.dtype == "bfloat16" and device.type == "cuda"

    def baseline() -> None:
        bare_step(model, opt, rows, budget=a.micro_batch_tokens, device=device, autocast=autocast)

    metrics: dict[str, Any] = {}

    def ours() -> None:
        metrics.update(trainer.step(batch))

    timings: dict[str, list[float]] = {"baseline": [], "ours": []}
    peaks: dict[str, list[float]] = {"baseline": [], "ours": []}
    oom: dict[str, bool] = {"baseline": False, "ours": False}
    repeats = a.repeats or shape["repeats"]
    for r in range(a.warmup + repeats):  # interleaved, so load changes hit both alike
        for name, fn in (("baseline", baseline), ("ours", ours)):
            if oom[name]:
                continue
            try:
                dt, peak = timed(fn, device)
            except torch.OutOfMemoryError:  # a result, not a crash: the other one still runs
                oom[name] = True
                for m in (model, trainer.model):
                    m.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                continue
            if r >= a.warmup:
                timings[name].append(dt)
                peaks[name].append(peak)
    tokens = sum(len(ids) for ids, _ in rows)
    nan = float("nan")
    base_s, ours_s = (statistics.median(timings[k]) if timings[k] else nan for k in timings)
    res = {
        "lengths": lengths,
        "rows": len(rows),
        "tokens": tokens,
        "completion_tokens": sum(len(ids) - p for ids, p in rows),
        "longest_row": max(len(ids) for ids, _ in rows),
        "baseline_ms": base_s * 1000,
        "ours_ms": ours_s * 1000,
        "baseline_tok_s": tokens / base_s,
        "ours_tok_s": tokens / ours_s,
        "speedup": base_s / ours_s,
        "ratio": ours_s / base_s,
        "baseline_peak_mib": max(peaks["baseline"], default=nan) / 2**20,
        "ours_peak_mib": max(peaks["ours"], default=nan) / 2**20,
        "baseline_oom": oom["baseline"],
        "ours_oom": oom["ours"],
        "attention": trainer.attention.describe(),
        "micro_batches": metrics.get("micro_batches"),
        "padding_frac": metrics.get("padding_frac"),
    }
    if a.head_tokens and device.type == "cuda":
        del model, opt
        torch.cuda.empty_cache()
        res["head"] = head_memory(trainer, a.head_tokens, device)
    return res


def report(res: dict[str, Any], a: argparse.Namespace) -> None:
    print(
        f"\n[{res['lengths']}] {res['rows']} rows, {res['tokens']} tokens "
        f"({res['completion_tokens']} completion, longest row {res['longest_row']})"
    )
    for name, label in (("baseline", "bare padded step"), ("ours", "Trainer.step")):
        if res[f"{name}_oom"]:
            print(f"{name:9s} {label:17s}: out of memory")
            continue
        peak = res[f"{name}_peak_mib"]
        print(
            f"{name:9s} {label:17s}: {res[f'{name}_ms']:9.1f} ms/step "
            f"{res[f'{name}_tok_s']:10.0f} tokens/s"
            + ("" if np.isnan(peak) else f", peak {peak:.0f} MiB")
        )
    print(f"ratio ours/baseline (time)   : {res['ratio']:8.2f}")
    print(f"speedup (tokens/s)           : {res['speedup']:8.2f}")
    padding = res["padding_frac"]
    print(
        f"ours: attention {res['attention']}; {res['micro_batches']} micro-batches, "
        f"padding {'n/a' if padding is None else f'{padding:.1%}'}"
    )
    if "head" in res:
        print(f"log-prob/entropy part alone: {json.dumps(res['head'])}")


def finite_or_none(value: Any) -> Any:
    """`value` with every NaN or infinity (a figure that does not exist) replaced by None, so
    the JSON is standard (no NaN tokens)."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(v) for v in value]
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )  # fmt: skip
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="demo")
    ap.add_argument("--lengths", default="equal", help="equal, mix, or both: equal,mix")
    ap.add_argument("--groups", type=int, default=0, help="groups per step (0: per shape)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=0, help="equal lengths (0: per shape)")
    ap.add_argument("--tokens", type=int, default=0, help="completion tokens, equal (0: shape)")
    ap.add_argument("--repeats", type=int, default=0, help="timed steps of each (0: per shape)")
    ap.add_argument("--warmup", type=int, default=-1, help="untimed rounds (default 1, CUDA 2)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    ap.add_argument("--dtype", default="", help="float32 | bfloat16 (default: bf16 on CUDA)")
    ap.add_argument("--micro-batch-tokens", type=int, default=C.TrainConfig().micro_batch_tokens)
    ap.add_argument("--attention", default="auto", help="model.attention for ours")
    ap.add_argument("--compile", action="store_true", help="model.compile for ours")
    ap.add_argument("--gradient-checkpointing", action="store_true", help="both steps")
    ap.add_argument("--head-tokens", type=int, default=0, help="CUDA: head memory on N positions")
    ap.add_argument(
        "--fsdp", action="store_true",
        help="ours = the FSDP2 learner at world size 1 (under torchrun --nproc-per-node 1)",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="", help="where the qwen05 model is built (default: tmp)")
    ap.add_argument("--model", default="", help="model directory to use instead of --shape's")
    ap.add_argument("--json", default="", help="write the results here")
    a = ap.parse_args(argv)
    for lengths in a.lengths.split(","):
        if lengths not in ("equal", "mix"):
            ap.error(f"--lengths: equal or mix, got {lengths!r}")
    if a.model and not (Path(a.model) / "config.json").is_file():
        ap.error(f"--model: {a.model} is not a model directory (no config.json)")
    if a.fsdp and World.from_env().size != 1:
        ap.error("--fsdp measures one rank: run under torchrun --nproc-per-node 1")
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    device = torch.device(a.device)
    a.dtype = a.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    if a.warmup < 0:  # CUDA: compiled kernels (flex_attention) see a few shapes first
        a.warmup = 2 if device.type == "cuda" else 1
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if a.model:
            model_dir = Path(a.model)
        elif a.shape == "qwen05":
            model_dir = build_qwen05(Path(a.work or tmp) / "qwen05", device=str(device))
        else:
            from launch.demo_model import ensure_demo_model

            model_dir = ensure_demo_model()
        out: dict[str, Any] = {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "shape": a.shape,
            "model": a.model or a.shape,
            "dtype": a.dtype,
            "torch": torch.__version__,
            "micro_batch_tokens": a.micro_batch_tokens,
            "gradient_checkpointing": a.gradient_checkpointing,
            "compile": a.compile,
            "torchrun": "LOCAL_RANK" in os.environ,
            "world_size": World.from_env().size,
            "fsdp": a.fsdp,
            "cases": {},
        }
        mbt = a.micro_batch_tokens
        print(f"{out['model']} on {out['device']}, {a.dtype}, micro_batch_tokens {mbt}")
        for lengths in a.lengths.split(","):
            res = run_case(a, model_dir, lengths, device)
            out["cases"][lengths] = res
            report(res, a)
    if a.json:
        Path(a.json).write_text(json.dumps(finite_or_none(out), indent=1, allow_nan=False))


if __name__ == "__main__":
    main()
