"""A producer: its engine, leases held, relaying and stress injections; the engines' settings."""

from __future__ import annotations

from dataclasses import dataclass

from common.config.fields import EngineName, _f, failed


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """`[producer]`: one producer process (the run's settings come from the consumer)."""

    engine: EngineName = _f("hf", "Generation engine.")
    id: str = _f("", "Producer name in logs and the ledger; empty = host-pid.")
    model: str = _f("", "Local model directory; empty = the path the consumer announces.")
    max_in_flight: int = _f(
        4,
        "Prompts (leases) a producer holds at once. launch sets it for hf producers by one rule, "
        "ceil((max_staleness + 1) * prompts_per_step / producers) (launch/cores.py); a producer "
        "started by hand holds this many unless told: give it the same rule's number. Its "
        "registration names them all (at most 65,536) and must fit net.max_message_mib: checked "
        "at start.",
    )
    device: str = _f("auto", "hf engine device: auto, cpu, cuda, cuda:N.")
    torch_threads: int = _f(
        0,
        "torch intra-op threads in an hf producer; 0 = on a CPU, shared with the run's learner "
        "and producers on this host by who has work, token step by token step "
        "(common/host/core_board.py).",
    )
    trust_local_hash: bool = _f(
        True,
        "Load a snapshot written on this very host (same boot) without hashing it again: its "
        "writer hashed the bytes it wrote. false = always hash.",
    )
    relay_host: str = _f(
        "",
        "Serve verified snapshots to other producers from this address (what they connect to; "
        "empty = do not relay).",
    )
    relay_port: int = _f(0, "Relay (ROUTER) port; 0 = pick a free one.")
    slow_factor: float = _f(1.0, "Stress testing: multiply generation latency (fake engine).")
    stall_after_s: float = _f(
        0.0, "Stress testing: stall once after this many seconds (0 = never)."
    )
    stall_s: float = _f(0.0, "Stress testing: length of that stall.")
    follow: bool = _f(
        False,
        "When a run finishes, wait for the next consumer at net.connect (up to "
        "net.consumer_timeout_s) and serve it too, keeping the engine if the model is the same "
        "(producers started once for a whole `asyncgrpo stress --external-producers` sweep).",
    )

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        return failed((self.max_in_flight >= 1, "producer.max_in_flight must be >= 1"))


@dataclass(frozen=True, slots=True)
class FakeEngineConfig:
    """`[fake]`: the fake engine's token streams, latency and coin rewards."""

    min_tokens: int = _f(4, "Shortest completion.")
    max_tokens: int = _f(16, "Longest completion (capped by max_new_tokens).")
    long_tail: float = _f(
        0.0, "Probability that a completion takes max_tokens (long-tail lengths)."
    )
    latency_s: float = _f(
        0.0, "Seconds per generate call (one group), before jitter and slow_factor."
    )
    per_token_s: float = _f(0.0, "Extra seconds per generated token of the longest completion.")
    jitter: float = _f(0.0, "Relative latency jitter: latency *= uniform(1 - jitter, 1 + jitter).")
    reward_p: float = _f(0.5, "Probability that a fake completion scores 1.")

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        return failed(
            (
                1 <= self.min_tokens <= self.max_tokens,
                "fake.min_tokens must be in [1, fake.max_tokens]",
            ),
        )


@dataclass(frozen=True, slots=True)
class VllmConfig:
    """`[vllm]`: the vLLM engine."""

    gpu_memory_utilization: float = _f(0.3, "Fraction of GPU memory vLLM takes.")
    max_model_len: int = _f(2048, "vLLM max sequence length.")
    dtype: str = _f("bfloat16", "vLLM weight dtype.")
    enforce_eager: bool = _f(False, "Disable CUDA graphs (faster start, slower decode).")
    max_num_seqs: int = _f(256, "vLLM scheduler: sequences decoded together.")
    inflight_updates: bool = _f(True, "Reload weights without waiting for requests to finish.")
    attention_backend: str = _f(
        "", "vLLM attention backend (e.g. FLASH_ATTN); empty = vLLM default."
    )

    def problems(self) -> list[str]:
        """None beyond the field types (vLLM checks its own settings when it starts)."""
        return []
