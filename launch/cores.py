"""How `launch` splits the cores it may use between the learner and the hf producers.

`cores` is `len(os.sched_getaffinity(0))`: the CPUs this process may run on (a container's or
`taskset`'s limit, not the machine's count). For hf producers (`plan`):
- the learner gets `ceil(cores / 2)` torch threads (`model.torch_threads`): it is the busiest
  process, and torch threads beyond the cores only spin;
- the producers share the rest: one producer per 2 of those cores (at least one), each with
  `rest // producers` torch threads (`producer.torch_threads`, at least 1);
- each producer may hold its share of every lease the staleness bound allows open,
  `ceil((max_staleness + 1) * prompts_per_step / producers)` (`producer.max_in_flight`): the hf
  engine samples all of a producer's leases in one batch, so fewer, fuller batches cost less.
On 2 cores that is 1 learner thread and 1 producer with 1 thread holding every lease, the
fastest split measured there on the demo (docs/results.md: one producer against two of 4 leases
each, async and sync). Beyond 2 cores the rule is a reasoned default, not a measured one.

Whatever the user gives explicitly (`--producers`, or the key in `--config` or `--set`) is kept;
the rule fills in the rest, and `describe` says which is which (printed at start).
"""

from __future__ import annotations

import math
import os
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

KEYS = ("model.torch_threads", "producer.torch_threads", "producer.max_in_flight")


@dataclass(frozen=True, slots=True)
class CorePlan:
    cores: int
    producers: int
    learner_threads: int  # model.torch_threads
    producer_threads: int  # producer.torch_threads
    max_in_flight: int  # producer.max_in_flight


def usable_cores() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


def plan(
    cores: int, *, max_staleness: int, prompts_per_step: int, producers: int | None = None
) -> CorePlan:
    """The rule (module docstring) for `cores` >= 1; `producers` when the user chose it."""
    assert cores >= 1, cores
    assert max_staleness >= 0, max_staleness
    assert prompts_per_step >= 1, prompts_per_step
    learner = math.ceil(cores / 2)
    rest = max(cores - learner, 1)
    producers = producers if producers is not None else max(1, rest // 2)
    assert producers >= 1, producers
    threads = max(1, rest // producers)
    leases = math.ceil((max_staleness + 1) * prompts_per_step / producers)
    return CorePlan(cores, producers, learner, threads, leases)


def describe(chosen: CorePlan, *, given: AbstractSet[str]) -> str:
    """One line for the start of a run: the split, and which parts the user gave."""

    def mark(key: str) -> str:
        return " (given)" if key in given else ""

    return (
        f"cores: {chosen.cores} usable -> {chosen.producers} producer"
        f"{'s' if chosen.producers != 1 else ''}{mark('producers')} x "
        f"{chosen.producer_threads} torch thread{mark('producer.torch_threads')}, "
        f"{chosen.max_in_flight} leases in flight each{mark('producer.max_in_flight')}; "
        f"learner {chosen.learner_threads} torch thread{mark('model.torch_threads')} "
        "(override: --producers, --set model.torch_threads=N, producer.torch_threads=N, "
        "producer.max_in_flight=N)"
    )
