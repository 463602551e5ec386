"""Tiny causal LMs built inside the tests: own character tokenizer, small Llama config.

Llama rather than Qwen2: transformers 5.x swaps in Qwen2's own byte-level tokenizer for any
`qwen2` model directory, which would not be ours."""

from __future__ import annotations

from pathlib import Path

CHARS = list("0123456789+-*=?() abcdefghijklmnopqrstuvwxyz")
SPECIALS = ["<pad>", "<eos>"]


def build_tiny_model(out: Path, *, seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """Write a complete HF model directory (config, weights, tokenizer) into `out`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters join without spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=vocab["<pad>"],
        eos_token_id=vocab["<eos>"],
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    return out
