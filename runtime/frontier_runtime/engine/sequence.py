"""One request's state inside the engine."""

from __future__ import annotations

import enum
import time

import torch

from frontier_runtime.requests import EngineTimes, FinishReason, SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Token ids (prompt + output), how many have K/V in the cache, and the blocks holding them.

    ``num_computed_tokens`` only ever counts tokens whose K/V is written; after a preemption it
    drops to 0 and the whole sequence (prompt and output so far) is recomputed.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival: int,
        stop_token_ids: frozenset[int],
        device: torch.device | str = "cpu",
        vocab_size: int = 0,
    ) -> None:
        self.request_id = request_id
        self.params = params
        self.arrival = arrival
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        resumed = params.continuation.output_token_ids if params.continuation is not None else ()
        # A continued generation: its earlier output is computed with the prompt (one prefill) and
        # counts as output (max_tokens, usage), exactly as if this engine had generated it.
        self.token_ids += resumed
        self.num_computed_tokens = 0
        self.num_cached_prompt_tokens = 0
        self.block_table: list[int] = []
        self.num_hashed_blocks = 0  # leading blocks registered in the prefix cache
        # Leading blocks freed behind a sliding window: their table cells are stale, and attention
        # gives them no weight (the kernels start at the window, the gather path masks them).
        self.num_released_blocks = 0
        self.status = Status.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_token_ids = stop_token_ids
        self.times = EngineTimes(added=time.monotonic())
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            # On the device the logits live on, so sampling never copies them to the host.
            self.generator = torch.Generator(device=device).manual_seed(params.seed)
            if resumed and not params.greedy:
                advance(self.generator, len(resumed), vocab_size, device)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )


def advance(generator: torch.Generator, tokens: int, vocab_size: int, device: torch.device | str) -> None:
    """Move a seeded request's generator past the draws of ``tokens`` sampled tokens: the sampler
    fills one float32 row of ``vocab_size`` exponentials from it per token (``Sampler._sample``), so
    the same fills here leave it where an uninterrupted run's would be."""
    if vocab_size < 1:
        raise ValueError("a continued seeded generation needs the model's vocab_size to advance its generator")
    row = torch.empty(vocab_size, dtype=torch.float32, device=device)
    for _ in range(tokens):
        row.exponential_(generator=generator)
