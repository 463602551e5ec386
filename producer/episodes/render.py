"""An episode's token ids, turn by turn: the opening prompt, then only each environment turn's new
tokens (token-in/token-out). What the model sampled is never decoded and encoded again.

`TurnRenderer(codec, tools=...)`:
- `opening(prompt)`: the prompt's ids as the producer encodes any prompt (producer/tokenizer.py),
  with the environment's tools described (producer/episodes/tools.py): through the chat template's
  `tools` argument when its template takes tools, else as a system message in the plain tool
  format. Says whether the episode is a chat (the chat template rendered it).
- `delta(messages, after=ids, chat=...)`: the ids to append after a model turn that sampled
  `ids`, for the environment's new `messages` and the next turn's generation prompt. With a chat
  template: the text the template writes after an assistant message's content (ChatML's
  `<|im_end|>\\n`), less what the model already sampled of it (its stop token `<|im_end|>`, when
  that is how its turn ended; a turn cut at max_new_tokens gets all of it), then the messages
  and the generation prompt as the template renders them after an assistant turn. Both texts
  come from rendering a conversation that stands in for the episode (a user turn and an
  assistant turn), with and without the new messages: the episode's own turns are never
  rendered again, so a template that rewrites earlier turns, and BPE merges across a turn
  boundary, cannot change a token the model sampled. The delta's text is tokenized alone, special
  tokens parsed, no BOS. A template for which the stand-in conversation with the messages does
  not start with the one without them cannot be extended turn by turn: `ConfigError` at start.
  Without a chat template (raw prompts, e.g. the demo model): the messages' contents, one after
  another, tokenized alone.
- Without a tokenizer (the fake engine): every text maps to byte ids, as prompts do there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from common.errors import ConfigError
from common.wire import ChatTurn
from producer.episodes import tools as T
from producer.tokenizer import PromptCodec

_STAND_IN = "Zq7xw"  # an assistant turn's content, found again in the rendered text


class TurnRenderer:
    """The token ids of an episode's opening and of each environment turn (module doc)."""

    def __init__(self, codec: PromptCodec, *, tools: Sequence[Callable[..., Any]] = ()) -> None:
        self.codec, self.tools = codec, tuple(tools)
        template = getattr(codec.tokenizer, "chat_template", None)
        self.template = bool(template)
        self.template_tools = self.template and "tools" in str(template)
        self._base = self._render(self._stand_in(), generation=False) if self.template else ""
        self._tail = self._suffix_probe() if self.template else ""

    def _render(self, messages: list[dict[str, str]], *, generation: bool) -> str:
        tok = self.codec.tokenizer
        assert tok is not None
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        return str(text)

    def _suffix_probe(self) -> str:
        """The template's text after an assistant message's content; `ConfigError` if the
        template cannot be extended turn by turn."""
        base = self._base
        at = base.rfind(_STAND_IN)
        if at < 0:
            raise ConfigError(
                "episodes: the chat template drops an assistant message's content; episodes "
                "need a template that renders every turn"
            )
        self._delta_text([("user", "probe")])  # raises ConfigError if not extensible
        return base[at + len(_STAND_IN) :]

    @staticmethod
    def _stand_in() -> list[dict[str, str]]:
        return [{"role": "user", "content": "x"}, {"role": "assistant", "content": _STAND_IN}]

    def _delta_text(self, messages: Sequence[tuple[str, str]]) -> str:
        """The template's text of `messages` and the generation prompt after an assistant turn."""
        base = self._base
        new = [{"role": r, "content": c} for r, c in messages]
        full = self._render(self._stand_in() + new, generation=True)
        if not full.startswith(base):
            raise ConfigError(
                "episodes: this chat template renders a conversation differently once a message "
                "follows it (the text of the turns before changes), so an episode cannot be "
                "extended turn by turn without re-tokenizing what was sampled"
            )
        return full[len(base) :]

    # ------------------------------------------------------------------------------------------
    def opening(self, prompt: str | Sequence[ChatTurn]) -> tuple[list[int], bool]:
        """(the prompt's ids, tools described; whether the episode is a chat)."""
        chat = self.template and (not isinstance(prompt, str) or self.codec.prompt_format == "chat")
        if not self.tools:
            return self.codec.encode(prompt), chat
        if not chat:
            text = prompt if isinstance(prompt, str) else "".join(t.content for t in prompt)
            return self._ids(T.describe(self.tools) + "\n\n" + text), False
        turns = [ChatTurn("user", prompt)] if isinstance(prompt, str) else list(prompt)
        messages = [{"role": t.role, "content": t.content} for t in turns]
        tok = self.codec.tokenizer
        assert tok is not None
        if self.template_tools:
            out: Any = tok.apply_chat_template(
                messages, tools=list(self.tools), add_generation_prompt=True, tokenize=True
            )
            if isinstance(out, Mapping):  # transformers 5 returns a BatchEncoding
                out = out["input_ids"]
            return [int(i) for i in out], True
        system = T.describe(self.tools)
        if messages and messages[0]["role"] == "system":
            messages[0] = {"role": "system", "content": messages[0]["content"] + "\n\n" + system}
        else:
            messages.insert(0, {"role": "system", "content": system})
        return self.codec.encode([ChatTurn(m["role"], m["content"]) for m in messages]), True

    def delta(
        self, messages: Sequence[tuple[str, str]], *, after: Sequence[int], chat: bool
    ) -> list[int]:
        """The ids to append after a model turn that sampled `after` (module docstring)."""
        if not chat:
            return self._ids("".join(content for _, content in messages))
        tail, tok = self._tail, self.codec.tokenizer
        if after and tok is not None:
            last = str(tok.decode([int(after[-1])], skip_special_tokens=False))
            if last and tail.startswith(last):
                tail = tail[len(last) :]
        return self._ids(tail + self._delta_text(messages))

    def _ids(self, text: str) -> list[int]:
        """`text` tokenized alone: special tokens parsed, nothing added."""
        tok = self.codec.tokenizer
        if tok is None:
            return [b % (self.codec.vocab_size - 1) for b in text.encode()]
        ids: list[int] = tok(text, add_special_tokens=False)["input_ids"]
        return [int(i) for i in ids]
