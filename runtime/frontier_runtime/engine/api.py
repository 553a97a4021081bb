"""The engine's public surface: what the server hands in and what it gets back.

The server (``frontier_runtime.server``) drives the engine only through these types and the
methods of ``LLMEngine``:

    engine = LLMEngine.from_config(runtime_config, model_dir)   # loads weights, sizes the KV cache
    engine.add_request(request_id, prompt_token_ids, SamplingParams(...))
    outputs: list[RequestOutput] = engine.step()               # one iteration of the batch
    engine.abort(request_id)                                    # frees its blocks at once
    engine.has_unfinished()  ->  bool
    engine.stats()           ->  EngineStats
    engine.tokenizer         ->  the loaded ``tokenizers.Tokenizer`` wrapper (encode / decode)

``step`` returns one ``RequestOutput`` per request that produced tokens (or finished) in that step;
``new_token_ids`` / ``new_text`` are the deltas since the previous output of that request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N logprobs per generated token; None = off

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be within 0..2, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be within (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be within 0..20, got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    kv_blocks_total: int
    kv_blocks_free: int
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    last_batch_size: int
    last_step_tokens: int
    steps: int

    @property
    def kv_usage(self) -> float:
        if self.kv_blocks_total == 0:
            return 0.0
        return 1.0 - self.kv_blocks_free / self.kv_blocks_total
