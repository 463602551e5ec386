"""Learner steps on fixed batches, in one process or on every rank under torchrun (gloo), for the
tests that hold a sharded learner equal to one process.

    torchrun --nproc-per-node 2 tests/sharded_steps.py MODEL_DIR OUT_DIR --steps 5 --record 1,5
        [--cases token-mean,token-sum] [--save-at 2] [--resume EARLIER_OUT_DIR]

For every case of `CASES` (aggregation modes, layouts, extra passes), a learner built by
`make_trainer` (the single-device `DeviceTrainer` at world size 1, else the FSDP2 one) takes
`--steps` steps on the batches of `batch(step)`; after each step in `--record`, rank 0 writes the
full weights to `OUT/<case>/step<k>.safetensors` and the step's metrics to
`OUT/<case>/step<k>.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.torch import load_file, save_file

from common import config as C
from common import wire
from common.files import run_files as RF
from common.sampling import kept_set

# (name, config overrides): every aggregation mode, and one case with packing, gradient
# checkpointing, two updates per batch (an old-log-prob pass) and a sharded reference model, and
# one with a learning-rate schedule
CASES: list[tuple[str, dict[str, object]]] = [
    ("token-mean", {}),
    ("token-sum", {"loss.agg": "token-sum"}),
    ("seq-mean-token-mean", {"loss.agg": "seq-mean-token-mean"}),
    ("seq-mean-token-sum", {"loss.agg": "seq-mean-token-sum"}),
    ("seq-mean-token-sum-norm", {"loss.agg": "seq-mean-token-sum-norm"}),
    (
        "packed-ckpt-2updates-kl",
        {
            "model.attention": "sdpa_packed",
            "model.gradient_checkpointing": True,
            "train.updates_per_batch": 2,
            "loss.beta": 0.05,
        },
    ),
    # a schedule whose lr differs at every step (warm-up, then cosine to a floor)
    (
        "cosine-warmup",
        {
            "train.lr_schedule": "cosine",
            "train.warmup_steps": 2,
            "train.lr_min_ratio": 0.1,
            "run.steps": 5,
        },
    ),
    # truncated sampling: kept sets shared with every rank, some tokens' sets unknown
    ("top-k-kept-sets", {"sampling.top_k": 6, "train.updates_per_batch": 2}),
    # the loss variants (docs/loss.md): two updates, so that their ratios move off 1
    (
        "gspo-rloo-overlong",
        {
            "loss.ratio_level": "sequence",
            "loss.agg": "seq-mean-token-mean",
            "loss.adv_baseline": "leave-one-out",
            "loss.overlong_window": 4,
            "train.updates_per_batch": 2,
        },
    ),
    (
        "gmpo-whiten-kept-sets",
        {
            "loss.objective": "gmpo",
            "loss.adv_baseline": "group-whiten",
            "loss.adv_scale": "none",
            "sampling.top_k": 6,
            "train.updates_per_batch": 2,
        },
    ),
    ("cispo", {"loss.objective": "cispo", "loss.clip_high": 1.0, "train.updates_per_batch": 2}),
    # a LoRA adapter on the frozen base: packed, checkpointed, two updates (weights = adapter),
    # a KL term to the reference (the base: the same model with the adapter off)
    (
        "lora",
        {
            "model.lora.enabled": True,
            "model.lora.rank": 4,
            "model.attention": "sdpa_packed",
            "model.gradient_checkpointing": True,
            "train.updates_per_batch": 2,
            "loss.agg": "seq-mean-token-mean",
            "loss.beta": 0.1,
        },
    ),
]


def config(model_dir: Path, overrides: dict[str, object]) -> C.Config:
    """Small micro-batches (several per rank, unequal counts), clipping active, lr visible; on
    the CPU unless `overrides` say otherwise."""
    base: dict[str, object] = {
        "model.path": str(model_dir),
        "model.device": "cpu",
        "train.lr": 1e-3,
        "train.grad_clip": 0.05,
        "train.micro_batch_tokens": 48,
        "sampling.max_new_tokens": 12,
        "train.prompts_per_step": 3,
        "sampling.group_size": 4,
    }
    return C.override(C.Config(), {**base, **overrides})


def batch(step: int, *, vocab: int, groups: int = 3, g: int = 4, kept: int = 0) -> list[wire.Group]:
    """Groups of prompts of 3-8 tokens and completions of 1-12 tokens, seeded by `step`; with
    `kept`, kept sets of 1 to `kept` ids per token, one token in 8 with its set unknown."""
    rng = np.random.default_rng(1000 + step)
    out = []
    for i in range(groups):
        p = int(rng.integers(3, 9))
        lens = rng.integers(1, 13, g).astype(np.int32)
        total = int(lens.sum())
        # kept sets drawn last: the cases without them see the same batches as ever
        prompt = rng.integers(2, vocab, p, dtype=np.int32)
        tokens = rng.integers(2, vocab, total, dtype=np.int32)
        behavior = -rng.random(total).astype(np.float32) - 0.5
        rewards = rng.random(g).astype(np.float32)
        sets = kept_set.KeptSets()
        if kept:
            unknown = np.flatnonzero(rng.random(total) < 1 / 8)
            others = [
                np.zeros(0, np.int32) if t in unknown else np.sort(np.setdiff1d(
                    rng.choice(vocab, int(rng.integers(1, kept + 1)), replace=False), [tok]
                )[: kept - 1]).astype(np.int32)
                for t, tok in enumerate(tokens.tolist())
            ]  # fmt: skip
            sets = kept_set.from_lists(others, unknown.tolist())
        out.append(
            wire.Group(
                lease_id=i,
                producer_id="t",
                prompt_index=i,
                behavior_version=0,
                prompt_ids=prompt,
                completion_ids=tokens,
                completion_lens=lens,
                behavior_logp=behavior,
                token_versions=np.zeros(0, np.int32),
                rewards=rewards,
                finish_reasons=("length",) * g,
                temperature=1.0,
                kept_counts=sets.other_counts(),
                kept_ids=sets.ids,
                kept_unknown=sets.unknown,
            )
        )
    return out


def run(
    model_dir: Path,
    out: Path,
    *,
    steps: int,
    record: set[int],
    cases: list[str] | None = None,
    save_at: int = 0,
    resume: Path | None = None,
    sets: dict[str, object] | None = None,
) -> None:
    """`steps` steps per case (from the checkpoint's step + 1 with `resume`, a run directory);
    with `save_at`, a checkpoint of each case after that step in `out/<case>/run`; `sets`
    override every case's config (`model.device`, `model.dtype`, ...)."""
    from consumer.train import adapter as LA
    from consumer.train import checkpoint, make_trainer
    from consumer.train.ranks import World

    world = World.from_env()
    for name, overrides in CASES:
        if cases is not None and name not in cases:
            continue
        cfg = config(model_dir, {**overrides, **(sets or {})})
        trainer = make_trainer(cfg, model_dir, world)
        if not world.main:
            trainer.follow()  # type: ignore[attr-defined]
            continue
        (out / name / "run").mkdir(parents=True, exist_ok=True)
        first = 1
        if resume is not None:
            first = checkpoint.load(resume / name / "run", trainer=trainer)[0] + 1
        for step in range(first, steps + 1):
            metrics = trainer.step(batch(step, vocab=trainer.vocab_size, kept=cfg.sampling.top_k))
            if step in record:
                weights = _untied(trainer.weights())
                save_file(
                    {k: v.detach().clone().contiguous() for k, v in weights.items()},
                    out / name / f"step{step}.safetensors",
                )
                (out / name / f"step{step}.json").write_text(json.dumps(metrics))
                if step == steps:  # evaluation's copy (rank 0, plain) holds the same weights
                    model = trainer.eval_model()
                    plain = LA.tensors(model) if trainer.adapter else model.state_dict()
                    assert all(plain[k].equal(v) for k, v in weights.items()), name
            if step == save_at:
                book = RF.BookState(book={})
                checkpoint.save(out / name / "run", trainer=trainer, version=step, book_state=book)
        trainer.close()


def torchrun(nproc: int, *args: str, log: Path, timeout_s: float = 300) -> None:
    """`torchrun --standalone --nproc-per-node N ARGS` to completion (its own process group,
    killed whole on timeout); an AssertionError with the end of its log if it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), *args]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(f"torchrun timed out: {log.read_text()[-4000:]}") from None
    assert code == 0, log.read_text()[-4000:]


def max_diff(a: Path, b: Path) -> float:
    """The largest absolute difference between two weight files of the same tensors."""
    wa, wb = load_file(a), load_file(b)
    assert wa.keys() == wb.keys()
    return max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)


def _untied(weights: dict[str, Any]) -> dict[str, Any]:
    seen, out = set(), {}
    for k, v in weights.items():
        if v.data_ptr() not in seen:
            seen.add(v.data_ptr())
            out[k] = v
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--record", default="1,5")
    parser.add_argument("--cases", default="", help="comma-separated names (default: all)")
    parser.add_argument("--save-at", type=int, default=0, help="checkpoint after this step")
    parser.add_argument("--resume", type=Path, default=None, help="an OUT of --save-at")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for every case")
    args = parser.parse_args()
    sets = dict(item.split("=", 1) for item in args.set)
    record = {int(s) for s in args.record.split(",")}
    cases = args.cases.split(",") if args.cases else None
    run(args.model_dir, args.out, steps=args.steps, record=record, cases=cases,
        save_at=args.save_at, resume=args.resume, sets=sets)  # fmt: skip
