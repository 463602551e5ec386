"""What a run is: its directory and length, the model, the prompts and the rewards."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from common.config.fields import (
    LearnerAttention,
    ModelDtype,
    PromptFormat,
    TaskSource,
    _f,
    _meta,
    failed,
)


@dataclass(frozen=True, slots=True)
class RunConfig:
    """`[run]`: where the run's files go, its seed and length, who it waits for."""

    dir: str = _f(
        "", "Run directory; empty = runs/TIMESTAMP. Holds config, metrics, ledger, snapshots."
    )
    seed: int = _f(0, "Seed for prompts order, sampling and initialisation.")
    steps: int = _f(
        200, "Optimizer steps the learner takes before it stops (0 = until prompts run out)."
    )
    resume: bool = _f(
        False,
        "Continue from the run directory's checkpoint (model, optimizer, RNG, cursor, ledger).",
    )
    record_stream: bool = _f(
        True,
        "Record every admitted group (its wire bytes) and each step's batch in RUN/stream/, so "
        "that `asyncgrpo replay` can train on the same data again (docs/replay.md).",
    )
    wait_for_producers: int = _f(
        0,
        "Grant no lease (and start no clock) until this many producers are registered and hold "
        "the run's first snapshot (0 = start with whoever comes).",
    )
    wait_for_producers_s: float = _f(
        600.0,
        "Give up after this long waiting for wait_for_producers (the consumer exits with the "
        "count it got; 0 = wait for ever).",
    )
    no_signal_groups: int = _f(
        2000,
        "Stop the run (exit 3, the reason in summary.md) after this many groups in a row "
        "arrived without a learning signal (all G rewards equal: a reward that always fails, "
        "or a task too hard or too easy for the model); 0 = never.",
    )
    no_signal_s: float = _f(
        300.0,
        "Stop it likewise when groups have kept arriving without a signal for this long "
        "(seconds; 0 = never).",
    )

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        return failed(
            (self.steps >= 0, "run.steps must be >= 0"),
            (
                self.wait_for_producers >= 0 and self.wait_for_producers_s >= 0,
                "run.wait_for_producers and run.wait_for_producers_s must be >= 0",
            ),
            (
                self.no_signal_groups >= 0 and self.no_signal_s >= 0,
                "run.no_signal_groups and run.no_signal_s must be >= 0",
            ),
        )


# The linear layers of a Llama / Qwen2 / Mistral decoder layer (what LoRA adapts by default)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True, slots=True)
class LoraConfig:
    """`[model.lora]`: train a LoRA adapter instead of every weight (docs/lora.md)."""

    enabled: bool = _f(
        False,
        "Train a LoRA adapter on the frozen base model: the optimizer holds the adapter only, "
        "snapshots are the adapter's file (megabytes) and producers apply it to their copy of "
        "the base (peft: pip install -e '.[lora]').",
    )
    rank: int = _f(8, "LoRA rank r (the adapter's inner dimension).")
    alpha: int = _f(16, "LoRA alpha: the adapter's update is scaled by alpha / rank.")
    dropout: float = _f(
        0.0,
        "Dropout on the adapter's input while training (0 keeps the learner's log-probs those "
        "the producers sampled with: ratio 1 at lag 0).",
    )
    target_modules: list[str] = _f(
        LORA_TARGETS,
        "Names of the linear modules to adapt (the last part of a module's name, as peft "
        "matches them, e.g. q_proj); a name no module of the model has is refused at start.",
    )

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        return failed(
            (self.rank >= 1, f"model.lora.rank = {self.rank}: must be >= 1"),
            (self.alpha >= 1, f"model.lora.alpha = {self.alpha}: must be >= 1"),
            (0 <= self.dropout < 1, f"model.lora.dropout = {self.dropout:g}: must be in [0, 1)"),
            (
                bool(self.target_modules) and all(self.target_modules),
                "model.lora.target_modules must name at least one module (no empty names)",
            ),
        )


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """`[model]`: the policy the learner trains and how it holds it."""

    path: str = _f(
        "demo",
        "Model to train and sample: a Hugging Face model directory, or a model name "
        "(ORG/NAME) from this host's Hugging Face cache, downloaded into it once when not there "
        "(never under HF_HUB_OFFLINE=1); 'demo' = the embedded tiny model.",
    )
    dtype: ModelDtype = _f("float32", "Learner parameter dtype.")
    device: str = _f("auto", "Learner device: auto (cuda if available), cpu, cuda, cuda:N.")
    gradient_checkpointing: bool = _f(False, "Recompute activations in backward to save memory.")
    attention: LearnerAttention = _f(
        "auto",
        "Learner attention: rows packed without padding (flash = flash-attn varlen, flex = "
        "torch flex_attention with a document mask, sdpa_packed = a dense block mask: exact but "
        "O(S^2), for small batches and tests), padded (SDPA, no mask for equal-length rows) or "
        "shared_prompt (each group's prompt once, its completions after it; padded where that "
        "saves too little). auto: flash if installed, else flex, else padded on CUDA; "
        "shared_prompt on a CPU.",
    )
    compile: bool = _f(
        False, "torch.compile each decoder layer of the learner (in place; off until measured)."
    )
    torch_threads: int = _f(
        0,
        "torch intra-op threads for the learner; 0 = on a CPU, shared with the run's hf "
        "producers on this host by who has work, pass by pass (common/host/core_board.py), else "
        "torch's default.",
    )
    deterministic: bool = _f(
        False,
        "Deterministic learner kernels on a GPU (torch.use_deterministic_algorithms, cuBLAS "
        "workspace :4096:8), so a replay reproduces every snapshot hash (docs/replay.md); CPU "
        "runs are deterministic without it.",
    )

    lora: LoraConfig = field(
        default_factory=LoraConfig,
        metadata=_meta("LoRA: train an adapter instead of every weight ([model.lora])."),
    )

    def problems(self) -> list[str]:
        """The adapter's settings (the model directory is checked where it is loaded)."""
        return self.lora.problems()


@dataclass(frozen=True, slots=True)
class TaskConfig:
    """`[task]`: where prompts come from (held-out rows: `[eval]`)."""

    source: TaskSource = _f(
        "synthetic",
        "Prompt source: the built-in synthetic task, or your own rows at task.path "
        "(docs/custom_task/README.md).",
    )
    path: str = _f(
        "",
        "The prompts: a JSONL or Parquet file (source = jsonl, parquet); for hf a save_to_disk "
        "directory, a local data file or directory, or a dataset name (ORG/NAME) from the "
        "local Hugging Face cache, downloaded into it once when not there (never under "
        "HF_HUB_OFFLINE=1).",
    )
    hf_config: str = _f(
        "", "source = hf: the dataset's configuration (load_dataset's name); empty = its default."
    )
    split: str = _f("train", "source = hf: the split of task.path to train on.")
    prompt_field: str = _f(
        "prompt",
        "Column holding the prompt: text, or a list of chat messages ({role, content}) rendered "
        "with the tokenizer's chat template.",
    )
    answer_field: str = _f(
        "answer",
        "Column holding the reference answer, given to rewards as `answer` (numbers become "
        "text); empty = none (answer is '').",
    )
    prompt_format: PromptFormat = _f(
        "raw",
        "A text prompt as raw text, or as one user message in the tokenizer's chat template "
        "(message lists always use the template).",
    )
    max_row_kib: float = _f(
        1024.0,
        "Largest row a lease carries (prompt, answer and the other columns, as JSON), in KiB; "
        "a larger row is refused when the data loads.",
    )
    shuffle: bool = _f(True, "Shuffle prompt order each epoch (seeded).")
    epochs: int = _f(0, "Passes over the prompts (0 = unlimited).")

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        return failed(
            (
                self.source == "synthetic" or bool(self.path),
                f"task.path is required when task.source = {self.source!r}",
            ),
            (bool(self.prompt_field), "task.prompt_field must name a column"),
            (
                self.prompt_field != self.answer_field,
                "task.prompt_field and task.answer_field must name different columns",
            ),
            (
                math.isfinite(self.max_row_kib) and self.max_row_kib > 0,
                "task.max_row_kib must be > 0",
            ),
        )


@dataclass(frozen=True, slots=True)
class RewardSpec:
    """One reward function of `rewards.fns` and its weight in the sum."""

    fn: str = _f("exact_match", "Built-in reward name or 'module:function'.")
    weight: float = _f(1.0, "Weight of this reward in the sum.")


def reward_names(fns: list[str]) -> list[str]:
    """One name per reward function, in order: the spec (`fn`), with `#2`, `#3`… for repeats
    of the same spec (the keys of the producer's per-function scores and of the per-function
    means in metrics.jsonl)."""
    out, seen = [], dict.fromkeys(fns, 0)
    for fn in fns:
        seen[fn] += 1
        out.append(fn if seen[fn] == 1 else f"{fn}#{seen[fn]}")
    return out


@dataclass(frozen=True, slots=True)
class RewardsConfig:
    """`[rewards]`: the verifiable rewards a producer scores completions with."""

    fns: list[RewardSpec] = field(
        default_factory=lambda: [RewardSpec()],
        metadata=_meta("Rewards summed with weights ([[rewards.fns]] tables)."),
    )
    timeout_s: float = _f(
        5.0, "Seconds a reward call may take; slower calls score 0 and are counted."
    )
    workers: int = _f(
        1, "Reward worker processes per producer (a hung reward is killed, not waited for)."
    )

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        return failed(
            (len(self.fns) >= 1, "rewards.fns needs at least one reward"),
            (
                self.timeout_s > 0 and self.workers >= 1,
                "rewards.timeout_s must be > 0 and rewards.workers >= 1",
            ),
        )
