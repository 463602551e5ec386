"""Prompt text → token ids and completion ids → text, as the producer's engine sees them.

`PromptCodec(model_dir, prompt_format, vocab_size=...)`:
- `prompt_format = "raw"`: the tokenizer's own encoding of the text (its special-token rules,
  e.g. a BOS it is configured to add); `"chat"`: the tokenizer's chat template with one user
  message and the generation prompt. A prompt given as chat messages (`wire.ChatTurn`s, from
  a row whose prompt is a message list) always goes through the chat template, whatever
  `prompt_format` says.
- `decode` drops special tokens (EOS included), which is what reward functions should see.
- `stop_ids`: the EOS id(s) of the tokenizer and the model's generation config; with `"chat"`,
  also every special token the chat template writes around a message (ChatML's `<|im_start|>`
  and `<|im_end|>`, Llama 3's `<|start_header_id|>`...): a model that emits one has ended its
  turn, and what it writes after it (a new "user" turn) is not its answer. SmolLM2-Instruct,
  sampled at temperature 1, ends a turn with `<|im_start|>` instead of its EOS `<|im_end|>` now
  and then.
- A prompt with characters the tokenizer maps to its unknown token (the demo tokenizer knows
  only digits, `+-*=` and space) is warned about once per producer, with the prompt and the
  characters it could not read: the model sees `<unk>` where the task put them.
- Without a model directory (fake engine) prompts map bytes to ids below `vocab_size - 1`
  (the fake engine's EOS is `vocab_size - 1`; messages: their contents, one after another)
  and completions decode to "".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from common.errors import ConfigError
from common.wire import ChatTurn

log = logging.getLogger("asyncgrpo.producer")


class PromptCodec:
    def __init__(self, model_dir: Path | None, prompt_format: str, *, vocab_size: int) -> None:
        self.prompt_format = prompt_format
        self.vocab_size = vocab_size
        self.tokenizer = None
        self.warned_unknown = False
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
        if prompt_format == "chat":
            stops.update(self._template_specials(model_dir))
        self.stop_ids = tuple(sorted(stops))

    def _template_specials(self, model_dir: Path) -> set[int]:
        """The special token ids in a one-message chat prompt (ConfigError without a template)."""
        assert self.tokenizer is not None
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(
                f"task.prompt_format = 'chat' but the tokenizer of {model_dir} has no chat "
                "template: use task.prompt_format = 'raw'"
            )
        special = set(self.tokenizer.all_special_ids) | {
            i for i, added in self.tokenizer.added_tokens_decoder.items() if added.special
        }
        return {int(i) for i in self._chat_ids([ChatTurn("user", "x")]) if i in special}

    def encode(self, prompt: str | Sequence[ChatTurn]) -> list[int]:
        """The token ids of a prompt: text, or chat messages (see the module doc)."""
        if isinstance(prompt, str) and self.prompt_format == "chat":
            prompt = [ChatTurn("user", prompt)]
        if self.tokenizer is None:
            text = prompt if isinstance(prompt, str) else "".join(t.content for t in prompt)
            return [b % (self.vocab_size - 1) for b in text.encode()] or [0]
        ids = (
            list(self.tokenizer(prompt)["input_ids"])
            if isinstance(prompt, str)
            else (self._chat_ids(prompt))
        )
        if not self.warned_unknown:
            self._check_unknown(prompt, ids)
        return ids

    def _check_unknown(self, prompt: str | Sequence[ChatTurn], ids: list[int]) -> None:
        """Warn (once) when `ids` hold the unknown token, naming the characters it replaced."""
        assert self.tokenizer is not None
        unk = self.tokenizer.unk_token_id
        if unk is None or unk not in ids:
            return
        self.warned_unknown = True
        text = prompt if isinstance(prompt, str) else " ".join(t.content for t in prompt)
        unread = sorted(
            {ch for ch in text if unk in self.tokenizer(ch, add_special_tokens=False)["input_ids"]}
        )
        log.warning(
            "the tokenizer maps %d of this prompt's %d tokens to its unknown token %s, so the "
            "model cannot read them: characters %s, e.g. in %r (said once; "
            "docs/observability.md)",
            ids.count(unk),
            len(ids),
            self.tokenizer.unk_token,
            "".join(unread[:20]),
            text[:120],
        )

    def _chat_ids(self, turns: Sequence[ChatTurn]) -> list[int]:
        """The chat template's ids of `turns` and the generation prompt."""
        assert self.tokenizer is not None
        messages = [{"role": t.role, "content": t.content} for t in turns]
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding (not a dict)
            ids = ids["input_ids"]
        return [int(i) for i in ids]  # type: ignore[arg-type]

    def decode(self, ids: np.ndarray) -> str:
        if self.tokenizer is None:
            return ""
        return str(self.tokenizer.decode(ids.tolist(), skip_special_tokens=True))
