"""OpenAI response bodies and stream chunks for the two generation routes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from frontier_runtime.requests import TokenLogprob

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class CompletionFormat:
    object_name = "text_completion"
    chunk_object = "text_completion"

    def __init__(self, response_id: str, model: str, created: int, decode: Callable[[int], str]) -> None:
        self.id = f"cmpl-{response_id}"
        self.model = model
        self.created = created
        self._decode = decode
        self._offset = 0

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def opening_chunk(self) -> dict[str, Any] | None:
        return None

    def chunk(
        self, text: str, logprobs: list[TokenLogprob] | None, finish_reason: str | None
    ) -> dict[str, Any]:
        choice = self._choice(self._chunk_content(text, finish_reason), logprobs, finish_reason)
        return self._envelope(self.chunk_object, [choice])

    def response(
        self, text: str, logprobs: list[TokenLogprob] | None, finish_reason: str, use: dict[str, Any]
    ) -> dict[str, Any]:
        choice = self._choice(self._response_content(text), logprobs, finish_reason)
        body = self._envelope(self.object_name, [choice])
        body["usage"] = use
        return body

    def _choice(
        self, content: dict[str, Any], logprobs: list[TokenLogprob] | None, finish_reason: str | None
    ) -> dict[str, Any]:
        """The one choice of a chunk or a response: its index, ``content`` (the text, as a delta or a
        message in chat), its logprobs and its finish reason, in that order."""
        return {"index": 0, **content, "logprobs": self.logprobs(logprobs), "finish_reason": finish_reason}

    def _chunk_content(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        return {"text": text}

    def _response_content(self, text: str) -> dict[str, Any]:
        return {"text": text}

    def usage_chunk(self, use: dict[str, Any]) -> dict[str, Any]:
        body = self._envelope(self.chunk_object, [])
        body["usage"] = use
        return body

    def logprobs(self, entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
        if entries is None:
            return None
        tokens, token_logprobs, tops, offsets = [], [], [], []
        for entry in entries:
            token = self._decode(entry.token_id)
            tokens.append(token)
            token_logprobs.append(entry.logprob)
            tops.append({self._decode(t): lp for t, lp in entry.top.items()})
            offsets.append(self._offset)
            self._offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }


class ChatFormat(CompletionFormat):
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, response_id: str, model: str, created: int, decode: Callable[[int], str]) -> None:
        super().__init__(response_id, model, created, decode)
        self.id = f"chatcmpl-{response_id}"

    def opening_chunk(self) -> dict[str, Any] | None:
        choice = self._choice({"delta": {"role": "assistant", "content": ""}}, None, None)
        return self._envelope(self.chunk_object, [choice])

    def _chunk_content(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        return {"delta": {"content": text} if text or finish_reason is None else {}}

    def _response_content(self, text: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": text}}

    def logprobs(self, entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
        if entries is None:
            return None
        content = []
        for entry in entries:
            token = self._decode(entry.token_id)
            top = [
                {
                    "token": (t := self._decode(tid)),
                    "logprob": lp,
                    "bytes": list(t.encode("utf-8", "replace")),
                }
                for tid, lp in entry.top.items()
            ]
            content.append(
                {
                    "token": token,
                    "logprob": entry.logprob,
                    "bytes": list(token.encode("utf-8", "replace")),
                    "top_logprobs": top,
                }
            )
        return {"content": content}
