"""Tiny causal LMs built inside the tests (own character tokenizer, small Llama config), and what
engine tests compare them with: an independent full-sequence forward and snapshots written the
way the publisher writes them. `build_chat_model` is one with a byte-level BPE tokenizer (merges
across words and digits, like a real one) and SmolLM2's ChatML chat template, for multi-turn
episodes (tests/integration/test_episodes_exact.py).

Llama rather than Qwen2: transformers 5.x swaps in Qwen2's own byte-level tokenizer for any
`qwen2` model directory, which would not be ours."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from producer.engines.base import Completion

CHARS = list("0123456789+-*=?() abcdefghijklmnopqrstuvwxyz")
SPECIALS = ["<pad>", "<eos>"]


def build_tiny_model(out: Path, *, seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """Write a complete HF model directory (config, weights, tokenizer) into `out`."""
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


CHATML = (  # SmolLM2-135M-Instruct's chat template, as its tokenizer_config.json holds it
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "What is 123 * 456? The answer is 56088.",
    "too high too low try again the answer 12 34 56 78 90 100 1000",
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "system user assistant tool calculator multiply result error",
] * 20


def build_chat_model(out: Path, *, seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """A model directory whose tokenizer is a byte-level BPE (trained here on a few sentences,
    ~300 tokens) with SmolLM2's ChatML template and specials; EOS `<|im_end|>`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=CHAT_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=CHAT_SPECIALS,
    )
    fast.chat_template = CHATML
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    eos = fast.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=eos,
        eos_token_id=eos,
        bos_token_id=None,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def reference_model(model_dir: Path, snapshot: Path | None = None) -> torch.nn.Module:
    """The model of `model_dir` (snapshot applied), loaded apart from any engine, float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if snapshot is not None:  # tied lm_head follows embed_tokens
        model.load_state_dict(load_file(snapshot / "model.safetensors"), strict=False)
    return model


@torch.no_grad()
def full_forward_logprobs(
    model: torch.nn.Module, prompt: list[int], c: Completion, temperature: float
) -> np.ndarray:
    """log_softmax(logits / T) of the completion's tokens, from one unpadded forward of it all."""
    ids = torch.tensor([prompt + c.token_ids.tolist()])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.from_numpy(c.token_ids).long()[:, None])[:, 0].numpy()


def write_snapshot(
    state: dict[str, torch.Tensor], directory: Path, *, noise: float = 0.0, seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Path:  # fmt: skip
    """A snapshot as the publisher writes it: tied duplicates dropped (first name kept)."""
    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    seen, out = set(), {}
    for name, t in state.items():
        if t.untyped_storage().data_ptr() in seen:
            continue
        seen.add(t.untyped_storage().data_ptr())
        out[name] = (t.detach().float() + noise * torch.randn(t.shape, generator=gen)).to(dtype)
    save_file(out, directory / "model.safetensors")
    return directory
