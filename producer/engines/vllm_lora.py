"""The vllm engine's LoRA adapters: one vLLM LoRA per version, enough of them kept registered.

With a LoRA run (`model.lora.enabled`, the producer's config: `launch` and `stress` give every
producer the run's config.toml; a producer started by hand for a LoRA run takes the same
`--config`, or `--set model.lora.enabled=true --set model.lora.rank=R`) vLLM starts with
`enable_lora` (`engine_kwargs`: `max_lora_rank` the smallest size vLLM supports that holds the
rank, `max_loras = max_cpu_loras = max_staleness + 2`) and never reloads its base weights: each
published version is registered as its own adapter (`LoRARequest(f"v{version}", version + 1,
dir)`, the directory with peft's file names written beside the verified file:
common/weights/adapter.py `write_peft_files`) and a request samples with the adapter of the
version the engine held when the request started, to its last token. A weight switch thus never
pauses generation, and every token of a completion has its request's version: per-token
versions stay true without a boundary.

Which adapters stay registered (`Slots`, pure): the newest `max_staleness + 1` versions and every
version a request in flight still samples with; any other is removed at the next switch.
Leases need weights of at least `step - max_staleness`, so at most `max_staleness + 1`
versions are in use at once in steady state, and one more is being added: `max_loras` slots
make every one of them resident together (vLLM batches requests of different adapters).

Checked on a GPU by tests/gpu/test_vllm_lora.py (`pytest -m gpu`); the bookkeeping by
tests/unit/test_vllm_lora.py on any machine.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

# the ranks vLLM's LoRA kernels are built for (vllm.config.lora: possible_max_ranks)
VLLM_MAX_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def slot_count(max_staleness: int) -> int:
    """Adapters vLLM keeps resident: the versions in use (max_staleness + 1) and the new one."""
    return max_staleness + 2


def engine_kwargs(rank: int, max_staleness: int) -> dict[str, Any]:
    """`AsyncEngineArgs` keywords for a LoRA run of `rank` (ValueError above vLLM's largest)."""
    fits = [r for r in VLLM_MAX_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"model.lora.rank = {rank}: vLLM serves LoRA ranks up to 512")
    slots = slot_count(max_staleness)
    return {
        "enable_lora": True,
        "max_lora_rank": fits[0],
        "max_loras": slots,
        "max_cpu_loras": slots,
    }


def lora_id(version: int) -> int:
    """vLLM's integer id of a version's adapter (ids start at 1)."""
    return version + 1


@dataclass
class Slots:
    """The versions registered with vLLM, oldest first (no I/O: the engine does the calls)."""

    keep: int  # max_staleness + 1: the newest versions kept whether in use or not
    registered: list[int] = field(default_factory=list)

    def add(self, version: int) -> bool:
        """Record `version` as registered; False if it already was (nothing to add)."""
        if version in self.registered:
            return False
        self.registered.append(version)
        self.registered.sort()
        return True

    def retire(self, in_use: Collection[int]) -> list[int]:
        """The versions to remove now: neither among the newest `keep` nor used by a request
        in flight; forgotten here (the caller removes them from vLLM)."""
        newest = set(self.registered[-self.keep :]) if self.keep > 0 else set()
        out = [v for v in self.registered if v not in newest and v not in in_use]
        self.registered = [v for v in self.registered if v not in out]
        return out
