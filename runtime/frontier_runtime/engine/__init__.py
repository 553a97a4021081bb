"""The inference engine: sequences, paged KV cache, scheduler, model runner, sampler.

Public entry points: ``LLMEngine`` (single-threaded, step by step) and ``AsyncEngine`` (owns an
``LLMEngine`` in a background thread and streams outputs to asyncio code).
"""

from frontier_runtime.engine.api import EngineStats, RequestOutput, SamplingParams, TokenLogprob

__all__ = ["EngineStats", "RequestOutput", "SamplingParams", "TokenLogprob", "LLMEngine", "AsyncEngine"]


def __getattr__(name: str):  # lazy: importing the API types must not pull in torch
    if name == "LLMEngine":
        from frontier_runtime.engine.llm_engine import LLMEngine

        return LLMEngine
    if name == "AsyncEngine":
        from frontier_runtime.engine.loop import AsyncEngine

        return AsyncEngine
    raise AttributeError(name)
