"""The engine's side of structured output: one llguidance matcher per constrained request, and the
token bitmasks of a step filled on a helper thread while the model runs that step.

The engine calls, in each step: ``start(samplers)`` right after the step is prepared (the matchers
already hold every token sampled so far, so the masks for this step's samples are known before
its forward); ``result()`` on what it returned just before sampling (by then the forward is done,
and the masks usually too: llguidance fills them in Rust with the GIL released); and
``accept(request_id, token)`` for each sampled token, which finishes the request with "stop" as
soon as its grammar is complete. Requests without a constraint cost one dict lookup per token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Protocol

import llguidance
import torch

from frontier_runtime.requests import FinishReason, StructuredOutput
from frontier_runtime.structured.bitmask import TokenBitmask, words_for
from frontier_runtime.structured.grammar import GrammarError, compile_grammar

log = logging.getLogger("frontier_runtime.structured")


class _Sampling(Protocol):
    request_id: str


class PendingMasks:
    """A step's masks being filled; ``result()`` returns them once filled."""

    def __init__(self, done: Future[None], masks: TokenBitmask, fill: Callable[[], None]) -> None:
        self._done = done
        self._masks = masks
        self._fill = fill

    def result(self) -> TokenBitmask:
        # Not started yet (on a machine with no core to spare, the helper thread may not have been
        # scheduled during the whole forward): fill here rather than sleep until it is.
        if self._done.cancel():
            self._fill()
        else:
            self._done.result()
        return self._masks


class StructuredDecoder:
    def __init__(
        self,
        tokenizer_json: str,
        vocab_size: int,
        eos_token_ids: Iterable[int],
        *,
        pin_memory: bool = False,
        threads: int = 1,
    ) -> None:
        eos = sorted(set(eos_token_ids))
        # n_vocab is the model's: logits rows past the tokenizer's vocabulary are never allowed. The
        # JSON slices (how the token trie is pre-split) only speed masks up: ~30 % faster than the
        # general ones on this runtime's JSON schemas (255 vs 369 us a mask, tiny model's vocab);
        # regex and choice grammars stay exact with them.
        self.tokenizer = llguidance.LLTokenizer(
            tokenizer_json,
            n_vocab=vocab_size,
            eos_token=eos or None,
            slices=llguidance.LLTokenizer.json_slices(),
        )
        self.vocab_size = vocab_size
        self.words = words_for(vocab_size)
        self.pin_memory = pin_memory
        self._matchers: dict[str, llguidance.LLMatcher] = {}
        self._executor = llguidance.LLExecutor(threads)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="frontier-grammar")

    @classmethod
    def for_model(
        cls, model_dir: Path, vocab_size: int, eos_token_ids: Iterable[int], *, pin_memory: bool = False
    ) -> StructuredDecoder | None:
        """None when the model ships no tokenizer.json (token-ids-only use): constraints are refused."""
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            return None
        return cls(path.read_text(), vocab_size, eos_token_ids, pin_memory=pin_memory)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._matchers

    def add(self, request_id: str, output: StructuredOutput, consumed: Sequence[int] = ()) -> None:
        """Start constraining ``request_id``; raises ``GrammarError`` (a ValueError) for a bad constraint.

        ``consumed``: tokens already generated under this constraint elsewhere (a continued
        generation). The matcher's state is rebuilt by feeding them through the grammar, as their
        sampling did; one the grammar refuses, or a grammar they already complete, is a
        ``GrammarError``: they were not generated under this constraint."""
        matcher = llguidance.LLMatcher(self.tokenizer, compile_grammar(output), log_level=0)
        if matcher.is_error():
            raise GrammarError(f"the {output.kind} constraint cannot be used: {matcher.get_error()}")
        for position, token in enumerate(consumed):
            if not matcher.consume_token(token):
                raise GrammarError(
                    f"continuation token {token} (position {position}) is refused by the {output.kind} "
                    f"constraint: {matcher.get_error()}"
                )
        if consumed and matcher.is_stopped():
            raise GrammarError(
                f"the continuation's {len(consumed)} tokens already complete the {output.kind} constraint"
            )
        self._matchers[request_id] = matcher

    def release(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def start(self, samplers: Sequence[_Sampling]) -> PendingMasks | None:
        """Begin filling the masks of the constrained rows among ``samplers`` (logits order)."""
        if not self._matchers:
            return None
        rows: list[int] = []
        matchers: list[tuple[llguidance.LLMatcher, int]] = []
        for row, seq in enumerate(samplers):
            matcher = self._matchers.get(seq.request_id)
            if matcher is not None:
                rows.append(row)
                matchers.append((matcher, len(matchers)))
        if not rows:
            return None
        bits = torch.empty((len(rows), self.words), dtype=torch.int32, pin_memory=self.pin_memory)
        # The helper thread runs nothing but the Rust call, which releases the GIL at once: the
        # engine thread is not held up while it builds and runs the step.
        fill = partial(
            self._executor.unsafe_compute_mask_ptr, matchers, bits.data_ptr(), self.words * 4, len(rows)
        )
        return PendingMasks(self._pool.submit(fill), TokenBitmask(rows, bits), fill)

    def accept(self, request_id: str, token: int) -> FinishReason | None:
        """Advance the request's matcher by its sampled token: "stop" once its grammar is complete,
        "abort" if the token broke the grammar (it cannot when the mask was applied), else None."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return None
        if not matcher.consume_token(token):
            log.error(
                "structured output: token refused by the grammar",
                extra={"request_id": request_id, "token": token, "error": matcher.get_error()},
            )
            return "abort"
        if matcher.is_stopped():
            return "stop"
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._matchers.clear()
