"""TRL's `GRPOTrainer` with a run's own settings (the demo's by default): the trainer most users
would pick.

    python bench/trl_grpo.py --out steps.jsonl [--config launch/configs/demo.toml] [--seed 0]
        [--steps N] [--threads 0] [--save-weights DIR]
    PYTHONPATH=docs/real_model python bench/trl_grpo.py --config docs/real_model/smollm2.toml \
        --out steps.jsonl --save-weights weights/

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

Any config's task works the same way: a model directory (`model.path`), the task's rows in
the run's order (chat rows, or `task.prompt_format = "chat"`, as TRL's conversational prompts:
the same chat template, so the same prompt ids as our producers'), its reward functions
(`module:function` found through PYTHONPATH), and the same stop tokens as our engines (the
tokenizer's EOS and the chat template's special tokens, set as the model's generation EOS, which
TRL samples to). `--save-weights DIR` writes the starting weights and each step's as
`DIR/v000000.safetensors`, `DIR/v000001.safetensors`, ... (after the step's `unix_time`; the
seconds it took are in `save_s`, so a caller can take them out of TRL's clock) for a held-out
evaluation afterwards, the same one for every trainer (bench/real_model_vs_trl.py).
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
from producer.tokenizer import PromptCodec

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "launch" / "configs" / "demo.toml"
PROMPTS_PER_STEP_MARGIN = 2  # TRL does not refill dropped groups: steps x prompts suffice


def prompts_in_order(cfg: C.Config, count: int) -> list[dict[str, Any]]:
    """The first `count` prompts of the run's prompt order, as a TRL dataset's rows (chat
    prompts in TRL's conversational form)."""
    source = make_source(cfg.task, seed=cfg.run.seed)
    t = cfg.task
    order = PromptOrder(len(source), seed=cfg.run.seed, shuffle=t.shuffle, epochs=t.epochs)
    rows: list[dict[str, Any]] = []
    for _ in range(count):
        index = order.next()
        if index is None:
            break
        row = source.get(index)
        turns = [{"role": m.role, "content": m.content} for m in row.messages]
        if not turns and t.prompt_format == "chat":
            turns = [{"role": "user", "content": row.prompt}]
        rows.append({"prompt": turns or row.prompt, "answer": row.answer})
    return rows


def text_of(completion: Any) -> str:
    """A TRL completion's text (conversational completions are message lists)."""
    return str(completion[-1]["content"]) if isinstance(completion, list) else str(completion)


def run(cfg: C.Config, out: Path, *, threads: int, save_weights: Path | None = None) -> None:
    from datasets import Dataset
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if threads:
        torch.set_num_threads(threads)
    model_dir = ensure_demo_model() if cfg.model.path == "demo" else Path(cfg.model.path)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    codec = PromptCodec(model_dir, cfg.task.prompt_format, vocab_size=model.config.vocab_size)
    model.generation_config.eos_token_id = list(codec.stop_ids)  # our engines' stops
    fns = [(resolve(r.fn), r.weight) for r in cfg.rewards.fns]

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        return [
            sum(w * fn(text_of(c), a) for fn, w in fns)
            for c, a in zip(completions, answer, strict=True)
        ]

    s, t, loss = cfg.sampling, cfg.train, cfg.loss
    synthetic = cfg.task.source == "synthetic"
    n_eval = cfg.eval.learner_prompts
    examples = make_examples("heldout", n_eval, seed=cfg.run.seed) if synthetic else []
    every = cfg.eval.learner_every_steps
    f = out.open("w")
    if save_weights is not None:
        save_weights.mkdir(parents=True, exist_ok=True)
        save_model(model, str(save_weights / "v000000.safetensors"))

    class Record(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            record: dict[str, Any] = {"step": state.global_step, "unix_time": time.time()}
            if save_weights is not None:
                t0 = time.perf_counter()
                path = save_weights / f"v{state.global_step:06d}.safetensors"
                save_model(kw["model"], str(path))
                record["save_s"] = time.perf_counter() - t0
            if synthetic and every and state.global_step % every == 0:
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
    ap.add_argument("--save-weights", type=Path, help="each step's weights here (safetensors)")
    ap.add_argument("--set", action="append", default=[], help="section.key=value (repeatable)")
    a = ap.parse_args()
    sets = [f"run.seed={a.seed}", *a.set] + ([f"run.steps={a.steps}"] if a.steps else [])
    run(C.load(a.config, sets), a.out, threads=a.threads, save_weights=a.save_weights)


if __name__ == "__main__":
    main()
