"""Text for the engine's token outputs: incremental detokenization and stop strings.

The engine core decides everything a token decides (stop token ids, grammar, length) and emits
``RequestOutput`` with ids only. ``OutputProcessor`` turns those into text deltas and finds stop
strings. ``LLMEngine`` runs it inline, in the step, so offline use sees the text at once and a
stop string ends the request in the step that produced it. ``AsyncEngine`` runs it on its own
output thread, off the engine thread: detokenizing then overlaps the next forward pass (whose
kernels release the GIL), and a stop string found there ends the stream at once and aborts the
request in the engine, which may have computed a token or two more by then; those are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from frontier_runtime.engine.detokenizer import IncrementalDetokenizer
from frontier_runtime.requests import Continuation, RequestOutput
from frontier_runtime.tokenizer import Tokenizer


@dataclass(frozen=True)
class Processed:
    output: RequestOutput  # with its text delta (and, on a stop string, finished)
    stopped_by_text: bool  # a stop string ended it here: the engine must drop the request


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}

    def add(self, request_id: str, stop: tuple[str, ...], continuation: Continuation | None = None) -> None:
        detok = IncrementalDetokenizer(self.tokenizer, stop)
        if continuation is not None:
            detok.resume(continuation.output_token_ids, continuation.emitted_chars)
        self._detokenizers[request_id] = detok

    def discard(self, request_id: str) -> None:
        self._detokenizers.pop(request_id, None)

    def process(self, out: RequestOutput) -> Processed:
        """``out`` with its text; the request's state is dropped once it finishes.

        ``out`` is filled in place: the engine builds a fresh output per request and step and hands
        it over only through here, so a copy per token (two, before) bought nothing."""
        detok = self._detokenizers.get(out.request_id)
        if detok is None:  # not ours (or already ended by a stop string): no text to add
            return Processed(out, False)
        if not out.finished and len(out.new_token_ids) == 1:  # a decode step's usual output
            stop_string = detok.append(out.new_token_ids[0])
            if stop_string is None:
                out.new_text = detok.take_delta(False)
                return Processed(out, False)
            out.finished, out.finish_reason, out.stop_reason = True, "stop", stop_string
            out.new_text = detok.take_delta(True)
            del self._detokenizers[out.request_id]
            return Processed(out, True)
        stop_string = None
        # A stop token ends the request but is not part of the text.
        ended_by_token = out.finished and isinstance(out.stop_reason, int)
        if not ended_by_token:
            for token in out.new_token_ids:
                stop_string = detok.append(token)
                if stop_string is not None:
                    break
        if stop_string is not None:
            out.finished, out.finish_reason, out.stop_reason = True, "stop", stop_string
        elif out.finished and out.new_token_ids and not ended_by_token:
            detok.flush()  # length or grammar: release what is left, even a partial character
        out.new_text = detok.take_delta(out.finished)
        if out.finished:
            del self._detokenizers[out.request_id]
        return Processed(out, stop_string is not None)
