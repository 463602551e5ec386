"""Prompt text → token ids and completion ids → text, as the producer's engine sees them.

`PromptCodec(model_dir, prompt_format, vocab_size=...)`:
- `prompt_format = "raw"`: the tokenizer's own encoding of the text (its special-token rules,
  e.g. a BOS it is configured to add); `"chat"`: the tokenizer's chat template with one user
  message and the generation prompt. A prompt given as chat messages (`wire.ChatTurn`s, from
  a row whose prompt is a message list) always goes through the chat template, whatever
  `prompt_format` says.
- `decode` drops special tokens (EOS included), which is what reward functions should see.
- `stop_ids`: the EOS id(s) of the tokenizer and the model's generation config.
- Without a model directory (fake engine) prompts map bytes to ids below `vocab_size - 1`
  (the fake engine's EOS is `vocab_size - 1`; messages: their contents, one after another)
  and completions decode to "".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from common.wire import ChatTurn


class PromptCodec:
    def __init__(self, model_dir: Path | None, prompt_format: str, *, vocab_size: int) -> None:
        self.prompt_format = prompt_format
        self.vocab_size = vocab_size
        self.tokenizer = None
        if model_dir is None:
            self.stop_ids: tuple[int, ...] = (vocab_size - 1,)
            return
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        stops = set()
        if self.tokenizer.eos_token_id is not None:
            stops.add(int(self.tokenizer.eos_token_id))
        gen = model_dir / "generation_config.json"
        if gen.exists():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            stops.update([eos] if isinstance(eos, int) else (eos or []))
        self.stop_ids = tuple(sorted(stops))

    def encode(self, prompt: str | Sequence[ChatTurn]) -> list[int]:
        """The token ids of a prompt: text, or chat messages (see the module doc)."""
        if isinstance(prompt, str) and self.prompt_format == "chat":
            prompt = [ChatTurn("user", prompt)]
        if self.tokenizer is None:
            text = prompt if isinstance(prompt, str) else "".join(t.content for t in prompt)
            return [b % (self.vocab_size - 1) for b in text.encode()] or [0]
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt)["input_ids"])
        messages = [{"role": t.role, "content": t.content} for t in prompt]
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict):  # newer transformers return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def decode(self, ids: np.ndarray) -> str:
        if self.tokenizer is None:
            return ""
        return str(self.tokenizer.decode(ids.tolist(), skip_special_tokens=True))
