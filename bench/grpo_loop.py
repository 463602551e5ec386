"""A single-process synchronous GRPO loop: the baseline that bench/vs_loop.py measures us against.

    python bench/grpo_loop.py --out steps.jsonl [--config launch/configs/demo.toml] [--seed 0]
        [--steps N] [--threads 0]

What a user would write instead of our pipeline, with our own math so that only the system
differs: one process, one model (sampling and training share the weights: no snapshots, no
sockets, no staleness), per step:
1. the next prompts of the run's prompt order (`consumer.data.prompts`, the consumer's own order);
2. one batched `model.generate(do_sample=True)` of prompts x G rows (left-padded), behaviour
   log-probs from its scores, log_softmax(logits / T) (the sampling rule of both sides);
3. rewards by the config's reward functions (`producer.rewards.runner`, called in-process);
4. groups whose rewards are all equal are dropped and replaced by new prompts when
   `train.drop_zero_variance` (as the learner does), until `train.prompts_per_step` groups;
5. one `consumer.train.trainer.DeviceTrainer.step` (advantages, TIS-GRPO loss, AdamW) on them,
   in order;
6. every `eval.learner_every_steps` steps the learner's periodic evaluation
(`consumer.evaluation.greedy`, the same
   held-out problems, greedy, `sampling.max_new_tokens`).
Writes one JSON line per step: step, unix_time (when the step ended, before any evaluation),
num_groups_sampled, and heldout_accuracy / eval_s on evaluation steps. `--threads 0` = torch's
default (all cores: the loop has the machine to itself).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import config as C
from common import wire
from common.task.synthetic import make_examples
from consumer.data.prompts import PromptOrder, make_source
from consumer.evaluation.greedy import accuracy_of
from consumer.staleness import zero_variance
from consumer.train.trainer import DeviceTrainer
from launch.demo_model import ensure_demo_model
from producer.rewards.calls import resolve

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "launch" / "configs" / "demo.toml"


class Sampler:
    """Batched `generate` of G completions per prompt with the sampling log-prob of each token."""

    def __init__(self, model: Any, tokenizer: Any, cfg: C.Config) -> None:
        self.model, self.tokenizer, self.s = model, tokenizer, cfg.sampling
        self.rewards = [(resolve(r.fn), r.weight) for r in cfg.rewards.fns]
        self.eos = tokenizer.eos_token_id

    @torch.inference_mode()
    def groups(self, prompts: list[tuple[int, str, str]], first_id: int) -> list[wire.Group]:
        """One group per (index, prompt, answer), lease ids from `first_id` on."""
        g, s = self.s.group_size, self.s
        texts = [p for _, p, _ in prompts for _ in range(g)]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True)
        self.model.eval()
        out = self.model.generate(
            **enc, do_sample=True, temperature=s.temperature, top_k=0, top_p=1.0,
            max_new_tokens=s.max_new_tokens, pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.eos, use_cache=True, output_scores=True, return_dict_in_generate=True,
        )  # fmt: skip
        self.model.train()
        ids_BL = out.sequences[:, enc["input_ids"].shape[1] :]
        # `scores` are the processed logits (divided by T): log_softmax is the sampling rule
        logp_BLV = torch.log_softmax(torch.stack(out.scores, dim=1).float(), dim=-1)
        logp_BL = logp_BLV.gather(-1, ids_BL[..., None])[..., 0].numpy()
        ids_BL, lengths_B = ids_BL.numpy(), _lengths(ids_BL.numpy(), self.eos)
        groups = []
        for k, (index, _, answer) in enumerate(prompts):
            rows = range(k * g, (k + 1) * g)
            ids = [ids_BL[r, : lengths_B[r]] for r in rows]
            texts = [self.tokenizer.decode(x, skip_special_tokens=True) for x in ids]
            prompt_ids = enc["input_ids"][k * g][enc["attention_mask"][k * g] == 1].numpy()
            groups.append(
                wire.Group(
                    lease_id=first_id + k, producer_id="loop", prompt_index=index,
                    behavior_version=0, prompt_ids=prompt_ids.astype(np.int32),
                    completion_ids=np.concatenate(ids).astype(np.int32),
                    completion_lens=np.array([len(x) for x in ids], np.int32),
                    behavior_logp=np.concatenate(
                        [logp_BL[r, : lengths_B[r]] for r in rows]
                    ).astype(np.float32),
                    token_versions=np.zeros(0, np.int32),
                    rewards=np.array([self.reward(t, answer) for t in texts], np.float32),
                    finish_reasons=tuple("stop" if x[-1] == self.eos else "length" for x in ids),
                    temperature=s.temperature,
                )
            )  # fmt: skip
        return groups

    def reward(self, text: str, answer: str) -> float:
        return float(sum(weight * fn(text, answer) for fn, weight in self.rewards))


def _lengths(ids_BL: np.ndarray, eos: int) -> np.ndarray:
    """Completion lengths: up to and including the first EOS, else the whole row."""
    is_eos = ids_BL == eos
    first = is_eos.argmax(axis=1)
    lengths: np.ndarray = np.where(is_eos.any(axis=1), first + 1, ids_BL.shape[1])
    return lengths


def run(cfg: C.Config, out: Path, *, threads: int) -> None:
    """Train `cfg.run.steps` steps, writing one JSON line per step to `out`."""
    from transformers import AutoTokenizer

    if threads:
        torch.set_num_threads(threads)
    model_dir = ensure_demo_model() if cfg.model.path == "demo" else Path(cfg.model.path)
    trainer = DeviceTrainer(cfg, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    sampler = Sampler(trainer.model, tokenizer, cfg)
    source = make_source(cfg.task, seed=cfg.run.seed)
    t = cfg.task
    order = PromptOrder(len(source), seed=cfg.run.seed, shuffle=t.shuffle, epochs=t.epochs)
    examples = make_examples("heldout", cfg.eval.learner_prompts, seed=cfg.run.seed)
    per_step, next_id, every = cfg.train.prompts_per_step, 0, cfg.eval.learner_every_steps
    with out.open("w") as f:
        for step in range(1, cfg.run.steps + 1):
            kept: list[wire.Group] = []
            sampled, gen_s = 0, None
            while len(kept) < per_step:
                indices = [order.next() for _ in range(per_step - len(kept))]
                rows = [(i, source.get(i)) for i in indices if i is not None]
                prompts = [(i, row.prompt, row.answer) for i, row in rows]
                if not prompts:
                    raise SystemExit(f"the prompts ran out at step {step}")
                t0 = time.perf_counter()
                groups = sampler.groups(prompts, next_id)
                gen_s = time.perf_counter() - t0 if gen_s is None else gen_s  # the step's first
                next_id, sampled = next_id + len(groups), sampled + len(groups)
                drop = cfg.train.drop_zero_variance
                kept += [g for g in groups if not (drop and zero_variance(g.rewards))]
            trainer.step(kept)
            record: dict[str, Any] = {"step": step, "unix_time": time.time()}
            record["num_groups_sampled"] = sampled
            record["gen_s"] = gen_s  # one generation: the step's first batch of groups
            if every and step % every == 0:
                t0 = time.perf_counter()
                n = cfg.sampling.max_new_tokens
                acc = accuracy_of(trainer.model, tokenizer, examples, max_new_tokens=n).accuracy
                record |= {"heldout_accuracy": acc, "eval_s": time.perf_counter() - t0}
            f.write(json.dumps(record) + "\n")
            f.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="JSONL, one line per step")
    ap.add_argument("--config", type=Path, default=DEMO_CONFIG)
    ap.add_argument("--seed", type=int, default=0, help="run.seed")
    ap.add_argument("--steps", type=int, default=0, help="run.steps (0 = the config's)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    a = ap.parse_args()
    sets = [f"run.seed={a.seed}", "model.torch_threads=0", 'model.device="cpu"']
    if a.steps:
        sets.append(f"run.steps={a.steps}")
    run(C.load(a.config, sets), a.out, threads=a.threads)


if __name__ == "__main__":
    main()
