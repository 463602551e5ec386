"""The run spec: the run settings a producer takes from the consumer in its `welcome` (one source
of truth: common/wire/messages.py's `Welcome.spec`), with the reward functions it names and the
files of the consumer's model directory, for a producer on a host without a copy
(producer/base_model.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RewardWeight:
    fn: str  # built-in name or "module:function", resolved on the producer
    weight: float


@dataclass(frozen=True, slots=True)
class ModelFile:
    """One file of the consumer's model directory (producer/base_model.py)."""

    name: str  # in the directory itself: config.json, model.safetensors, tokenizer.json, ...
    num_bytes: int
    hash: str  # blake3 hex digest of the file


@dataclass(frozen=True, slots=True)
class EpisodeSpec:
    """A multi-turn run's episodes (the consumer's `[episodes]` section, producer/episodes/)."""

    env: str  # the environment: a built-in name or "module:function"
    max_turns: int  # model turns per episode at most
    max_episode_tokens: int  # tokens after the prompt (sampled and inserted) at most
    timeout_s: float  # seconds one environment call may take
    latency_s: float  # simulated environment latency: the scale of a Pareto draw per call (0: off)
    latency_alpha: float  # its tail index (smaller: heavier tail)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """The run settings a producer takes from the consumer (one source of truth)."""

    group_size: int
    vocab_size: int
    max_staleness: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    max_kept: int  # bounds every kept set when top_p, top_k or min_p is on
    max_new_tokens: int
    prompt_format: str  # "raw" | "chat"
    model: str
    rollouts_port: int
    announce_port: int
    heartbeat_s: float  # net.heartbeat_s: the shortest period a status names (Status.heartbeat_s)
    max_message_bytes: int
    reward_fns: tuple[RewardWeight, ...]
    reward_timeout_s: float
    data_port: int  # the consumer's data socket (snapshot chunks: consumer/snapshots/dataplane.py)
    eval_samples: int = 1  # completions per eval lease (eval.samples_per_prompt)
    eval_temperature: float = 1.0  # of eval leases (eval.temperature; 0 = greedy)
    # the consumer's model directory, for a producer on a host without a copy: fetched from
    # the data socket (`file_chunk_req` of file "model/NAME") and checked against each hash
    model_files: tuple[ModelFile, ...] = ()
    episodes: EpisodeSpec | None = None  # multi-turn episodes (None: one completion per sample)
