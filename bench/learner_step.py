"""Learner step time with the demo model vs a bare forward/backward/AdamW step, same batch.

    python bench/learner_step.py [--groups 8] [--group-size 8] [--tokens 5] [--repeats 30]

- baseline: the HF model, one padded batch, cross-entropy on the completion tokens, backward,
  AdamW step: the least any learner must do.
- ours: `consumer.trainer.Trainer.step` on the same groups (advantages, micro-batch planning,
  sampling log-probs at the temperature, TIS-GRPO loss, metrics, gradient clipping).
Prints median milliseconds per step and the ratio ours/baseline (1.0 = no overhead).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import config as C
from common import wire
from consumer.trainer import Trainer
from launch.demo_model import ensure_demo_model


def groups(n: int, g: int, tokens: int, vocab: int, seed: int = 0) -> list[wire.Group]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        out.append(
            wire.Group(
                lease_id=i,
                producer_id="b",
                prompt_index=i,
                behavior_version=0,
                prompt_ids=rng.integers(2, vocab, 6, dtype=np.int32),
                completion_ids=rng.integers(2, vocab, g * tokens, dtype=np.int32),
                completion_lens=np.full(g, tokens, np.int32),
                behavior_logp=np.full(g * tokens, -2.0, np.float32),
                token_versions=np.zeros(0, np.int32),
                rewards=(rng.random(g) < 0.5).astype(np.float32),
                finish_reasons=("length",) * g,
                temperature=1.0,
            )
        )
    return out


def bare_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: list[wire.Group]) -> None:
    rows = [
        np.concatenate([g.prompt_ids, g.completion(i)[0]])
        for g in batch
        for i in range(g.group_size)
    ]
    ids = torch.from_numpy(np.stack(rows).astype(np.int64))
    labels = ids.clone()
    labels[:, : len(batch[0].prompt_ids)] = -100
    loss = model(input_ids=ids, labels=labels).loss
    opt.zero_grad()
    loss.backward()
    opt.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model_dir = ensure_demo_model()
    cfg = C.Config()
    cfg = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, device="cpu", path=str(model_dir))
    )
    trainer = Trainer(cfg, model_dir)
    batch = groups(a.groups, a.group_size, a.tokens, trainer.vocab_size)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    timings: dict[str, list[float]] = {"baseline": [], "ours": []}
    for _ in range(a.repeats):  # interleaved, so load changes hit both alike
        t0 = time.perf_counter()
        bare_step(model, opt, batch)
        timings["baseline"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        trainer.step(batch)
        timings["ours"].append(time.perf_counter() - t0)
    base, ours = (statistics.median(timings[k]) * 1000 for k in ("baseline", "ours"))
    rows = a.groups * a.group_size
    print(
        f"batch: {a.groups} groups x G={a.group_size} = {rows} rows, "
        f"{a.tokens} completion tokens each"
    )
    print(f"baseline  forward+backward+AdamW : {base:8.1f} ms/step")
    print(f"ours      Trainer.step           : {ours:8.1f} ms/step")
    print(f"ratio ours/baseline              : {ours / base:8.2f}")


if __name__ == "__main__":
    main()
