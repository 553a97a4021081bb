"""The engine's client interface: ``EngineClient``, what the server needs from an engine, with the
``EngineStats`` it reports and the ``EngineDeadError`` it raises once stopped. Requests themselves
are :mod:`frontier_runtime.requests`.

Torch-free, so the server and tools can import it without loading the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from frontier_runtime.requests import RequestOutput, SamplingParams


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
    attention_backend: str = ""  # the ops.attention backend's name; "" before an engine is loaded
    # "native-<variant>[+panel-gemm]" (the prebuilt CPU library, e.g. native-avx512), "triton-fused"
    # (CUDA: RMSNorm, SwiGLU and rotary + KV write as Triton kernels) or "torch" (torch ops only)
    kernels: str = ""
    # What the replica's ranks measured of their links at start (GB/s, nccl-tests' busbw); 0: one rank.
    interconnect_bus_gbps: float = 0.0
    # Prefill/decode disaggregation: blocks pulled and pulls failed (decode), leases held and
    # expired unclaimed (prefill); 0 on a colocated replica.
    kv_blocks_pulled: int = 0
    kv_pulls_failed: int = 0
    kv_leases: int = 0
    kv_leases_expired: int = 0

    @property
    def kv_usage(self) -> float:
        if self.kv_blocks_total == 0:
            return 0.0
        return 1.0 - self.kv_blocks_free / self.kv_blocks_total


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (shut down, or failed)."""


class KvTransferError(RuntimeError):
    """A decode replica could not pull a prompt's KV blocks from its prefill replica, and its
    ``kv_transfer.on_failure`` is ``fail``: the request ends with this (naming the replica)."""


@runtime_checkable
class EngineClient(Protocol):
    """What the server drives: ``AsyncEngine`` is the real one. Call ``submit`` inside an event loop,
    the rest from any thread."""

    @property
    def heartbeat(self) -> float:
        """``time.monotonic()`` of the engine loop's last iteration; it advances while idle too."""
        ...

    @property
    def is_running(self) -> bool:
        """False once the loop has stopped or failed: the engine takes no more requests."""
        ...

    @property
    def replica_lost(self) -> str | None:
        """Why the replica no longer works (one of its ranks or nodes was lost), or None. Once set,
        ``is_running`` is False for good: only a restart of every node brings the replica back."""
        ...

    def submit(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request and stream its outputs; leaving the stream early aborts the request.

        Raises ValueError for a request the engine refuses and EngineDeadError when it no longer runs.
        """
        ...

    def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends with finish_reason "abort" and its KV blocks are freed."""
        ...

    def stats(self) -> EngineStats: ...

    def warmup(self, timeout_s: float = 600.0) -> float:
        """Run one real request through the engine (blocking); returns its seconds."""
        ...

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Abort what is left and stop the engine (blocking)."""
        ...
