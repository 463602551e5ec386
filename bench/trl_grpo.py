"""TRL's `GRPOTrainer` on the demo with the demo's settings: the trainer most users would pick.

    python bench/trl_grpo.py --out steps.jsonl [--config launch/configs/demo.toml] [--seed 0]
        [--steps N] [--threads 0]

Needs `trl` (an optional bench dependency: `pip install -e '.[bench]'`; never a runtime one).
Settings taken from the config: model (the demo model, float32, CPU), prompts in the run's own order
(`consumer.data.prompts`, TRL's shuffling off), G, temperature, max_new_tokens, prompts per step
(per-device batch = prompts x G completions), AdamW lr / betas / weight decay / warm-up with a
constant schedule, gradient clip, gradient checkpointing, PPO clip, beta; token-mean aggregation is
TRL's `loss_type="dapo"`, group-std advantages its `scale_rewards="group"`. What TRL does not do:
drop zero-variance groups (it trains on them with zero advantage) and the TIS correction (not
needed: it samples with the weights it trains). Rewards: the config's reward functions
(`producer.rewards.runner`). Every `eval.learner_every_steps` steps the learner's periodic
evaluation (`consumer.evaluation.greedy`, same held-out problems). Writes the same JSON lines as
bench/grpo_loop.py: step, unix_time (end of the step, before evaluation), heldout_accuracy and
eval_s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import config as C
from common.task.synthetic import make_examples
from consumer.data.prompts import PromptOrder, make_source
from consumer.evaluation.greedy import accuracy_of
from launch.demo_model import ensure_demo_model
from producer.rewards.calls import resolve

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "launch" / "configs" / "demo.toml"
PROMPTS_PER_STEP_MARGIN = 2  # TRL does not refill dropped groups: steps x prompts suffice


def prompts_in_order(cfg: C.Config, count: int) -> list[dict[str, str]]:
    """The first `count` prompts of the run's prompt order, as a TRL dataset's rows."""
    source = make_source(cfg.task, seed=cfg.run.seed)
    t = cfg.task
    order = PromptOrder(len(source), seed=cfg.run.seed, shuffle=t.shuffle, epochs=t.epochs)
    rows = []
    for _ in range(count):
        index = order.next()
        if index is None:
            break
        row = source.get(index)
        rows.append({"prompt": row.prompt, "answer": row.answer})
    return rows


def run(cfg: C.Config, out: Path, *, threads: int) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if threads:
        torch.set_num_threads(threads)
    model_dir = ensure_demo_model() if cfg.model.path == "demo" else Path(cfg.model.path)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    fns = [(resolve(r.fn), r.weight) for r in cfg.rewards.fns]

    def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [
            sum(w * fn(c, a) for fn, w in fns) for c, a in zip(completions, answer, strict=True)
        ]

    s, t, loss = cfg.sampling, cfg.train, cfg.loss
    examples = make_examples("heldout", cfg.eval.learner_prompts, seed=cfg.run.seed)
    every = cfg.eval.learner_every_steps
    f = out.open("w")

    class Record(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            record: dict[str, Any] = {"step": state.global_step, "unix_time": time.time()}
            if every and state.global_step % every == 0:
                t0 = time.perf_counter()
                n = s.max_new_tokens
                acc = accuracy_of(kw["model"], tokenizer, examples, max_new_tokens=n).accuracy
                record |= {"heldout_accuracy": acc, "eval_s": time.perf_counter() - t0}
            f.write(json.dumps(record) + "\n")
            f.flush()

    dataset = Dataset.from_list(
        prompts_in_order(cfg, cfg.run.steps * t.prompts_per_step * PROMPTS_PER_STEP_MARGIN)
    )
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, use_cpu=True, bf16=False, seed=cfg.run.seed, max_steps=cfg.run.steps,
            per_device_train_batch_size=t.prompts_per_step * s.group_size,
            num_generations=s.group_size, max_completion_length=s.max_new_tokens,
            temperature=s.temperature, top_k=0, top_p=1.0, shuffle_dataset=False,
            learning_rate=t.lr, lr_scheduler_type="constant", warmup_steps=t.warmup_steps,
            adam_beta1=t.betas[0], adam_beta2=t.betas[1], weight_decay=t.weight_decay,
            max_grad_norm=t.grad_clip, epsilon=loss.clip_low, epsilon_high=loss.clip_high,
            beta=loss.beta, loss_type="dapo", scale_rewards="group", num_iterations=1,
            gradient_checkpointing=cfg.model.gradient_checkpointing,
            save_strategy="no", report_to="none", logging_strategy="no", disable_tqdm=True,
        )  # fmt: skip
        trainer = GRPOTrainer(
            model=model, reward_funcs=reward, args=args, train_dataset=dataset,
            processing_class=tokenizer, callbacks=[Record()],
        )  # fmt: skip
        trainer.train()
    f.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="JSONL, one line per step")
    ap.add_argument("--config", type=Path, default=DEMO_CONFIG)
    ap.add_argument("--seed", type=int, default=0, help="run.seed")
    ap.add_argument("--steps", type=int, default=0, help="run.steps (0 = the config's)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    a = ap.parse_args()
    sets = [f"run.seed={a.seed}"] + ([f"run.steps={a.steps}"] if a.steps else [])
    run(C.load(a.config, sets), a.out, threads=a.threads)


if __name__ == "__main__":
    main()
