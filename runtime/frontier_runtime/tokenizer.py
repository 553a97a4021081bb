"""The model's tokenizer: ``tokenizer.json`` through `tokenizers`, plus the chat template and
special tokens of ``tokenizer_config.json`` / ``generation_config.json``.

Chat prompts: ``apply_chat_template(messages)`` renders the template (which writes the BOS token
itself), then ``encode(text, add_special_tokens=False)``; ``encode_chat`` does both.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jinja2 import Template
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.decoders import DecodeStream


class ChatTemplateError(ValueError):
    """The chat template refused the messages (e.g. roles out of order)."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


# One sandbox for every chat template: templates come with downloaded weights, so they must not
# reach Python internals. Compiled templates are safe to render from several threads.
_TEMPLATES = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_TEMPLATES.globals["raise_exception"] = _raise


def compile_chat_template(source: str) -> Template:
    return _TEMPLATES.from_string(source)


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older tokenizer_config.json files
        return value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no tokenizer.json in the model directory")
        self._tok = _HFTokenizer.from_file(str(path))
        cfg_path = model_dir / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        gen_path = model_dir / "generation_config.json"
        gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}

        self.chat_template: str | None = cfg.get("chat_template")
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.bos_token_id = self.token_to_id(self.bos_token) if self.bos_token else gen.get("bos_token_id")
        eos_ids: list[int] = []
        eos_id = self.token_to_id(self.eos_token) if self.eos_token else None
        if eos_id is not None:
            eos_ids.append(eos_id)
        gen_eos = gen.get("eos_token_id")
        for tid in gen_eos if isinstance(gen_eos, list) else ([] if gen_eos is None else [gen_eos]):
            if tid not in eos_ids:
                eos_ids.append(tid)
        self.eos_token_ids: tuple[int, ...] = tuple(eos_ids)
        self._template: Template | None = None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def decode_stream(self, skip_special_tokens: bool = True) -> Callable[[int], str | None]:
        """A stepper for one generation: each token id in, the text it completes out (None while a
        character is incomplete). The tokenizers library keeps the decoded prefix, so a token costs
        one decode in Rust where ``decode`` on growing windows costs two from Python."""
        # A partial of the bound method: no Python frame per token.
        return functools.partial(DecodeStream(skip_special_tokens=skip_special_tokens).step, self._tok)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        template: Template | None = None,
    ) -> str:
        """Render ``messages`` with ``template`` (``compile_chat_template``), by default the model's own."""
        if template is None:
            if not self.chat_template:
                raise ChatTemplateError("this model has no chat_template in tokenizer_config.json")
            if self._template is None:
                self._template = compile_chat_template(self.chat_template)
            template = self._template
        return template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(
            self.apply_chat_template(messages, add_generation_prompt), add_special_tokens=False
        )
