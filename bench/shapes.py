"""Model shapes the GPU benchmarks build with random weights (no download): one definition.

`QWEN05_SHAPE` is Qwen2.5-0.5B's architecture (hidden 896, 24 layers, 14 heads, 2 KV heads,
intermediate 4864, vocab 151936, tied embeddings), for `transformers.Qwen2Config(**QWEN05_SHAPE)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

QWEN05_SHAPE: dict[str, Any] = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def build_qwen05(out: Path, *, seed: int = 0, device: str = "cpu") -> Path:
    """A random-initialised model of Qwen2.5-0.5B's shape saved to `out` (bf16, no tokenizer)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (out / "config.json").exists():
        return out
    torch.manual_seed(seed)
    cfg = Qwen2Config(**QWEN05_SHAPE, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)  # type: ignore[arg-type]
    model.save_pretrained(out)
    return out
