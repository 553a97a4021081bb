"""Incremental detokenization with stop strings.

Byte-level BPE tokens can end inside a multi-byte character: decoding such a prefix yields U+FFFD.
Text is only released once the pending tokens decode to complete characters, so a delta never
splits a character. When stop strings are set, the last ``max(len(stop)) - 1`` characters are held
back until they can no longer begin a stop string, so streamed text never shows part of a stop
string that the final text then drops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class _Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: _Decoder | None, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.prefix_offset = 0  # decoding restarts here: the text before it is final
        self.read_offset = 0  # ids before this are already part of `text`
        self.text = ""
        self.emitted = 0
        # The tokenizers library's stream decoder where the tokenizer offers one: the same offsets
        # and the same rule as ``_decode_window`` (it keeps the prefix's text, so a token costs one
        # decode, in Rust). The offsets above are kept in step with it for ``flush``.
        make_stream = getattr(tokenizer, "decode_stream", None)
        self._stream: Callable[[int], str | None] | None = make_stream() if make_stream is not None else None

    def append(self, token_id: int) -> str | None:
        """Add one token; return the stop string that now ends the text, if any."""
        self.ids.append(token_id)
        if self.tokenizer is None:
            return None
        new: str | None
        if self._stream is not None:
            try:
                new = self._stream(token_id)
            except Exception:  # noqa: BLE001 - a decode that does not extend its prefix: the window rule
                self._stream = None  # its state is now behind; the windows carry on from the offsets
                new = self._decode_window()
        else:
            new = self._decode_window()
        if not new:
            return None  # an incomplete character (or a special token that decodes to nothing)
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        before = len(self.text)
        self.text += new
        return self._truncate_at_stop(before) if self.stop else None

    def _decode_window(self) -> str | None:
        """The text the ids after ``read_offset`` add, once it ends in a complete character."""
        assert self.tokenizer is not None
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None
        return full[len(prefix) :]

    def resume(self, token_ids: tuple[int, ...], emitted_chars: int) -> None:
        """Carry on a generation another replica began: read its tokens as if generated here (a stop
        string found among them would have ended it there, so none is looked for), and treat the
        first ``emitted_chars`` characters of their text as sent."""
        stop, self.stop = self.stop, ()
        for token in token_ids:
            self.append(token)
        self.stop = stop
        self.emitted = min(emitted_chars, len(self.text))

    def _truncate_at_stop(self, before: int) -> str | None:
        best: tuple[int, str] | None = None
        for s in self.stop:
            idx = self.text.find(s, max(0, before - len(s) + 1))
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is None:
            return None
        self.text = self.text[: best[0]]
        return best[1]

    def flush(self) -> None:
        """At the end: release what is left, even an incomplete character."""
        if self.tokenizer is None or self.read_offset == len(self.ids):
            return
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        self.read_offset = len(self.ids)
        before = len(self.text)
        self.text += full[len(prefix) :]
        self._truncate_at_stop(before)

    def take_delta(self, finished: bool) -> str:
        end = len(self.text)
        if not finished and self.holdback:
            end = max(self.emitted, end - self.holdback)
        if end == self.emitted:
            return ""
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
