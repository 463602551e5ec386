"""Which device each process of a local run gets: the learner's GPU, one GPU per producer.

A pure rule (`plan`) from the GPUs this machine shows and what the user asked for, and the
environment each child process then gets (`CUDA_VISIBLE_DEVICES`, so that inside a process its
GPU is always `cuda:0`). GPU indices are positions in this process's own view: when the sweep
itself runs under `CUDA_VISIBLE_DEVICES=4,5`, index 0 means physical GPU 4.

The rule (either list may be given, the other follows):
- no GPU visible (or the fake engine): learner and producers on the CPU, `producers` of them;
  a child never sees a GPU then (`CUDA_VISIBLE_DEVICES=""`);
- learner: `learner_gpus` (one GPU: the learner is a single process), else the first GPU that
  no producer was given, else GPU 0;
- producers: one per GPU of `producer_gpus` (a GPU listed twice takes two), else one per GPU the
  learner does not use, else one producer beside the learner on its GPU (colocated);
- a vLLM producer takes `colocated_memory` of a GPU it shares with the learner and 0.9 of one
  of its own, split evenly between the producers on one GPU (`vllm.gpu_memory_utilization`).

`Placement.describe()` is what results.csv records ("learner gpu0; p1 gpu0 (vllm 0.40)").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from common.errors import ConfigError

DEDICATED_MEMORY = 0.9  # vLLM's share of a GPU it has to itself


@dataclass(frozen=True, slots=True)
class Placement:
    """Devices of one local run. Empty `learner_gpus` and None per producer mean the CPU."""

    learner_gpus: tuple[int, ...]
    producer_gpus: tuple[int | None, ...]  # one entry per producer
    vllm_memory: tuple[float | None, ...]  # vllm.gpu_memory_utilization per producer
    visible: tuple[str, ...] = ()  # physical ids behind the indices (this process's view)

    @property
    def num_producers(self) -> int:
        return len(self.producer_gpus)

    def _physical(self, index: int) -> str:
        return self.visible[index] if index < len(self.visible) else str(index)

    def consumer_env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(self._physical(g) for g in self.learner_gpus)}

    def producer_env(self, index: int) -> dict[str, str]:
        gpu = self.producer_gpus[index]
        return {"CUDA_VISIBLE_DEVICES": "" if gpu is None else self._physical(gpu)}

    def producer_sets(self, index: int) -> list[str]:
        """`--set` arguments of producer `index` (its vLLM memory share)."""
        share = self.vllm_memory[index]
        return [] if share is None else ["--set", f"vllm.gpu_memory_utilization={share:.3f}"]

    def describe(self) -> str:
        learner = ",".join(f"gpu{g}" for g in self.learner_gpus) or "cpu"
        parts = [f"learner {learner}"]
        for i, (gpu, share) in enumerate(zip(self.producer_gpus, self.vllm_memory, strict=True)):
            where = "cpu" if gpu is None else f"gpu{gpu}"
            parts.append(f"p{i + 1} {where}" + ("" if share is None else f" (vllm {share:.2f})"))
        return "; ".join(parts)


def plan(
    *,
    num_gpus: int,
    engine: str,
    producers: int | None,
    learner_gpus: list[int] | None = None,
    producer_gpus: list[int] | None = None,
    colocated_memory: float = 0.4,
    visible: tuple[str, ...] = (),
) -> Placement:
    """The placement rule of the module docstring; `ConfigError` for what cannot be placed."""
    asked = learner_gpus is not None or producer_gpus is not None
    if engine == "fake" or num_gpus == 0:
        if asked and engine != "fake":
            raise ConfigError("--learner-gpus/--producer-gpus: no CUDA GPU is visible here")
        if engine == "vllm":
            raise ConfigError("--engine vllm needs a CUDA GPU and none is visible here")
        count = 2 if producers is None else producers
        return Placement((), (None,) * count, (None,) * count, visible)
    for name, gpus in (("--learner-gpus", learner_gpus), ("--producer-gpus", producer_gpus)):
        bad = [g for g in gpus or [] if not 0 <= g < num_gpus]
        if bad:
            raise ConfigError(
                f"{name}: GPU {bad[0]} does not exist (this machine shows {num_gpus})"
            )
    if learner_gpus is not None and len(learner_gpus) != 1:
        raise ConfigError(
            "--learner-gpus: give exactly one GPU (the learner trains in one process here)"
        )
    if learner_gpus is None:
        taken = set(producer_gpus or [])
        learner = next((g for g in range(num_gpus) if g not in taken), 0)
    else:
        learner = learner_gpus[0]
    if producer_gpus is None:
        producer_gpus = [g for g in range(num_gpus) if g != learner] or [learner]
    if producers is not None and producers != len(producer_gpus):
        raise ConfigError(
            f"--producers {producers}: on GPUs there is one producer per producer GPU "
            f"({len(producer_gpus)} here: {producer_gpus}); list GPUs twice in --producer-gpus "
            "for two producers on one GPU"
        )
    if not 0 < colocated_memory < 1:
        raise ConfigError(f"--colocated-memory must be in (0, 1), got {colocated_memory}")
    per_gpu = Counter(producer_gpus)
    shares: list[float | None] = []
    for gpu in producer_gpus:
        whole = colocated_memory if gpu == learner else DEDICATED_MEMORY
        shares.append(round(whole / per_gpu[gpu], 3) if engine == "vllm" else None)
    return Placement((learner,), tuple(producer_gpus), tuple(shares), visible)


def visible_gpus() -> tuple[int, tuple[str, ...]]:
    """(number of CUDA GPUs this process sees, their ids under CUDA_VISIBLE_DEVICES if set)."""
    import os

    import torch

    count = torch.cuda.device_count()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = tuple(x.strip() for x in env.split(",") if x.strip()) if env else ()
    return count, ids[:count]


def placements(
    *,
    engine: str,
    producer_counts: list[int] | None,
    learner_gpus: list[int] | None = None,
    producer_gpus: list[int] | None = None,
    colocated_memory: float = 0.4,
) -> dict[int, Placement]:
    """The placement of every producer count a sweep asks for (None: what `plan` picks), on the
    GPUs this process sees (none looked for with the fake engine)."""
    num_gpus, visible = visible_gpus() if engine != "fake" else (0, ())
    out = {}
    counts: list[int | None] = [*producer_counts] if producer_counts else [None]
    for count in counts:
        p = plan(
            num_gpus=num_gpus,
            engine=engine,
            producers=count,
            learner_gpus=learner_gpus,
            producer_gpus=producer_gpus,
            colocated_memory=colocated_memory,
            visible=visible,
        )
        out[p.num_producers] = p
    return out
