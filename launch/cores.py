"""How `launch` and `stress` use the cores they may use: hf producers, their leases, and threads.

`cores` is `len(os.sched_getaffinity(0))`: the CPUs this process may run on (a container's or
`taskset`'s limit, not the machine's count).

Threads are not split here. Every process of the run on this host takes its torch threads from
the host's core board before each unit of work (common/host/core_board.py): the processes that have
work share the cores, in proportion to the CPU-seconds a step costs each of them, and one that
waits gives its cores to the others. A fixed split cannot do that: on SmolLM2-135M the learner's
step and the producer's generation each filled a core for seconds and then waited for the other,
so with one thread each a core idled whenever one of them waited.

What is decided once, at start (`plan`), from what a step costs (`Costs`: the model's size and
the task's lengths, `estimate`):
- producers: the cores the producers' share of the work would fill when the learner and they
  are busy together, one producer per 2 of them (at least one); more producers hold more copies
  of the model and cut each one's batch, and a producer's threads follow its work anyway;
- leases in flight per producer, `ceil((max_staleness + 1) * prompts_per_step / producers)`
  (`producer.max_in_flight`): the hf engine samples all of a producer's leases in one batch, so
  fewer, fuller batches cost less.
On 2 cores that is one producer holding every lease, the learner and it sharing the two cores.

Whatever the user gives explicitly (`--producers`, `producer.max_in_flight`, or torch threads:
`model.torch_threads`, `producer.torch_threads` fix a process's threads and the others share
the rest) is kept; `describe` says which is which (printed at start).
"""

from __future__ import annotations

import math
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.host.core_board import usable_cores

KEYS = ("producer.max_in_flight",)
THREAD_KEYS = ("model.torch_threads", "producer.torch_threads")
__all__ = ["KEYS", "THREAD_KEYS", "CorePlan", "Costs", "costs", "describe", "plan", "usable_cores"]


@dataclass(frozen=True, slots=True)
class Costs:
    """Multiply-adds of one optimizer step, by who does them (GFLOP, 2 per multiply-add)."""

    learner_gflop: float  # forward and backward of the trained groups (prompt once per group)
    generation_gflop: float  # sampling them: each prompt once, then one token at a time

    @property
    def learner_share(self) -> float:
        return self.learner_gflop / (self.learner_gflop + self.generation_gflop)


def costs(
    model: Any,
    *,
    prompt_tokens: float,
    completion_tokens: float,
    group_size: int,
    prompts_per_step: int,
) -> Costs:
    """A step's costs for a transformers config `model` (a decoder's linear maps and its LM
    head; attention's own products are left out: short sequences)."""
    d = int(model.hidden_size)
    heads = int(model.num_attention_heads)
    kv = int(getattr(model, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(model, "head_dim", None) or d // heads)
    ff = int(getattr(model, "intermediate_size", None) or 4 * d)
    layer = 2 * d * heads * head_dim + 2 * d * kv * head_dim + 3 * d * ff
    decoder, head = layer * int(model.num_hidden_layers), d * int(model.vocab_size)
    sampled = group_size * completion_tokens
    per_group_positions = prompt_tokens + sampled  # the shared-prompt layout
    learner = 6 * (decoder * per_group_positions + head * sampled)
    generation = 2 * (decoder * per_group_positions + head * (sampled + 1))
    return Costs(learner * prompts_per_step / 1e9, generation * prompts_per_step / 1e9)


def estimate(cfg: Any, prompts: int = 16) -> Costs | None:
    """The run's step costs from its model's config.json and its first prompts, rendered as
    producers render them, completions at `sampling.max_new_tokens`; None when the model or
    its tokenizer is not readable here (the rule then splits evenly)."""
    from transformers import AutoConfig

    from consumer.data.prompts import make_source
    from producer.tokenizer import PromptCodec

    path = Path(cfg.model.path)
    if not (path / "config.json").is_file():
        return None
    model = AutoConfig.from_pretrained(path)
    try:
        codec = PromptCodec(path, cfg.task.prompt_format, vocab_size=int(model.vocab_size))
        source = make_source(cfg.task, seed=cfg.run.seed)
        rows = [source.get(i) for i in range(min(prompts, len(source)))]
        lengths = [len(codec.encode(r.messages or r.prompt)) for r in rows]
    except (OSError, ValueError):
        return None
    return costs(
        model,
        prompt_tokens=sum(lengths) / len(lengths),
        completion_tokens=cfg.sampling.max_new_tokens,
        group_size=cfg.sampling.group_size,
        prompts_per_step=cfg.train.prompts_per_step,
    )


@dataclass(frozen=True, slots=True)
class CorePlan:
    cores: int
    producers: int
    max_in_flight: int  # producer.max_in_flight
    learner_cores: int  # what the learner takes while producers are busy too (weights alike)
    costs: Costs | None


def plan(
    cores: int,
    *,
    max_staleness: int,
    prompts_per_step: int,
    producers: int | None = None,
    step_costs: Costs | None = None,
) -> CorePlan:
    """The rule (module docstring) for `cores` >= 1; `producers` when the user chose it."""
    assert cores >= 1, cores
    assert max_staleness >= 0, max_staleness
    assert prompts_per_step >= 1, prompts_per_step
    share = step_costs.learner_share if step_costs is not None else 0.5
    learner = min(max(round(cores * share), 1), max(cores - 1, 1))
    rest = max(cores - learner, 1)
    producers = producers if producers is not None else max(1, rest // 2)
    assert producers >= 1, producers
    leases = math.ceil((max_staleness + 1) * prompts_per_step / producers)
    return CorePlan(cores, producers, leases, learner, step_costs)


def describe(chosen: CorePlan, *, given: AbstractSet[str], fixed: dict[str, int]) -> str:
    """One line for the start of a run: the plan, why, and which parts the user gave."""

    def mark(key: str) -> str:
        return " (given)" if key in given else ""

    c = chosen.costs
    why = (
        f"a step ~{c.learner_gflop:.0f} GFLOP of training, ~{c.generation_gflop:.0f} of "
        "sampling each time its groups are sampled"
        if c is not None
        else "step costs unknown here"
    )
    threads = ", ".join(f"{k} = {v} (given)" for k, v in fixed.items() if v) or (
        "shared by who has work, step by step (common/host/core_board.py)"
    )
    return (
        f"cores: {chosen.cores} usable -> {chosen.producers} producer"
        f"{'s' if chosen.producers != 1 else ''}{mark('producers')}, "
        f"{chosen.max_in_flight} leases in flight each{mark('producer.max_in_flight')} ({why}); "
        f"torch threads {threads} (override: --producers, --set producer.max_in_flight=N, "
        "model.torch_threads=N, producer.torch_threads=N)"
    )
