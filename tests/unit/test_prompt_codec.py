"""producer/tokenizer.py with a chat template: prompts are the template's token ids, and every
special token the template writes around a message stops a completion (a model that emits
one has ended its turn). A tokenizer of our own, no model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.errors import ConfigError
from producer.tokenizer import PromptCodec

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _tokenizer_dir(out: Path, *, chat_template: str | None) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list("abcdefghijklmnopqrstuvwxyz ?\n")
    vocab = {t: i for i, t in enumerate(["<unk>", "<|im_start|>", "<|im_end|>", *chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(out)
    return out


def test_a_chat_prompt_is_the_templates_token_ids(tmp_path):
    codec = PromptCodec(_tokenizer_dir(tmp_path, chat_template=CHATML), "chat", vocab_size=32)
    ids = codec.encode("hi")
    start, end = 1, 2
    letters = [codec.tokenizer.convert_tokens_to_ids(c) for c in "user\nhi"]
    assert ids[: 1 + len(letters) + 1] == [start, *letters, end]
    assert all(isinstance(i, int) for i in ids)
    assert codec.decode(np.array(ids, np.int32)) == "user\nhi\nassistant\n"  # specials dropped


def test_the_templates_special_tokens_stop_a_chat_completion_only(tmp_path):
    model_dir = _tokenizer_dir(tmp_path, chat_template=CHATML)
    assert PromptCodec(model_dir, "chat", vocab_size=32).stop_ids == (1, 2)  # start and end
    assert PromptCodec(model_dir, "raw", vocab_size=32).stop_ids == (2,)  # EOS alone


def test_chat_format_without_a_template_is_a_config_error(tmp_path):
    model_dir = _tokenizer_dir(tmp_path, chat_template=None)
    with pytest.raises(ConfigError, match="no chat template"):
        PromptCodec(model_dir, "chat", vocab_size=32)


def test_a_prompt_with_unknown_characters_is_warned_about_once_with_an_example(tmp_path, caplog):
    import logging

    codec = PromptCodec(_tokenizer_dir(tmp_path, chat_template=None), "raw", vocab_size=31)
    with caplog.at_level(logging.WARNING, logger="asyncgrpo.producer"):
        codec.encode("what is 2+2?")
        codec.encode("and 3+3?")
        codec.encode("fine")
    (line,) = [r.getMessage() for r in caplog.records]
    assert "maps 3 of this prompt's 12 tokens to its unknown token <unk>" in line
    assert "characters +2, e.g. in 'what is 2+2?'" in line


def test_a_prompt_the_tokenizer_reads_is_not_warned_about(tmp_path, caplog):
    codec = PromptCodec(_tokenizer_dir(tmp_path, chat_template=None), "raw", vocab_size=31)
    codec.encode("what is it?")
    assert not caplog.records
