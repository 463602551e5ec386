"""Generation engines: the contract (`base`), the `fake`, `hf` (transformers, with its batch in
`hf_batch`, the prompts' common prefix in `hf_prefix`, its LoRA adapters in `hf_adapter`) and
`vllm` engines (vLLM's outputs read by `vllm_outputs`, a token's kept set by `vllm_kept`, its
LoRA adapters by `vllm_lora`), and the factory `make_engine`.

The event loop of the producer process calls them (`generate`, `load_weights`); hf and vllm run
their model work on threads or processes of their own. The heavy engines are imported only by
`make_engine`, when one is built, so fake-engine producers never import torch.
"""

from __future__ import annotations

from pathlib import Path

from common.config import Config
from common.sampling.kept_set import NO_TRUNCATION, Truncation
from producer.engines.base import Engine


def make_engine(
    cfg: Config,
    *,
    model_dir: Path | None,
    vocab_size: int,
    seed: int,
    truncation: Truncation = NO_TRUNCATION,
    max_staleness: int = 0,
) -> Engine:
    """Build the engine `cfg.producer.engine` names. `model_dir` is unused by the fake engine;
    `truncation` (the run's) is what a vllm engine is started for (its max_logprobs, and the
    release check); the others take it per request. A vllm engine for a LoRA run
    (`model.lora.enabled`) keeps `max_staleness + 2` adapters (producer/engines/vllm_lora.py)."""
    name = cfg.producer.engine
    if name == "fake":
        from producer.engines.fake import FakeEngine

        f = cfg.fake
        return FakeEngine(
            vocab_size=vocab_size,
            eos_token_id=vocab_size - 1,
            seed=seed,
            min_tokens=f.min_tokens,
            max_tokens=f.max_tokens,
            long_tail=f.long_tail,
            latency_s=f.latency_s,
            per_token_s=f.per_token_s,
            jitter=f.jitter,
            slow_factor=cfg.producer.slow_factor,
        )
    assert model_dir is not None, "hf and vllm engines need a model directory"
    if name == "hf":
        from producer.engines.hf import HFEngine

        return HFEngine(model_dir, device=cfg.producer.device, seed=seed)
    if name == "vllm":
        from producer.engines.vllm import VLLMEngine

        lora = cfg.model.lora
        return VLLMEngine(
            model_dir,
            cfg.vllm,
            seed=seed,
            truncation=truncation,
            lora=(lora.rank, max_staleness) if lora.enabled else None,
        )
    raise AssertionError(f"unknown engine {name!r} (config validation lists the choices)")
