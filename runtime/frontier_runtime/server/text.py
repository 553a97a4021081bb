"""Prompt text → token ids for the server, and chat messages → prompt text.

The model's own ``Tokenizer`` (``frontier_runtime.tokenizer``) does the work; this adds what the
HTTP layer needs on top: a sane chat template when the model ships none, and one error type for
any way a template can refuse a conversation (answered 400, never 500).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from frontier_runtime.tokenizer import ChatTemplateError, Tokenizer, compile_chat_template

# Used when the model ships no chat template: ChatML role tags, which most instruction data uses.
DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TemplateRenderError(ValueError):
    """The chat template refused the messages (for example roles that do not alternate)."""


class TextCodec:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        # None: the model's own template.
        self._template = None if tokenizer.chat_template else compile_chat_template(DEFAULT_CHAT_TEMPLATE)

    @classmethod
    def from_dir(cls, model_dir: Path) -> TextCodec:
        return cls(Tokenizer(model_dir))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def decode_token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def render_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt, self._template)
        except (
            ChatTemplateError,
            TemplateError,
            TypeError,
            ValueError,
            KeyError,
            IndexError,
            AttributeError,
        ) as exc:
            raise TemplateRenderError(f"the chat template cannot render these messages: {exc}") from None
