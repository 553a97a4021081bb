"""Attention of one step's query tokens over the paged KV cache: one call per layer, every sequence.

Token ``t`` of a sequence lives at slot ``table[t // block_size] * block_size + t % block_size``
of each layer's cache, laid out as the backend's traits say (``ops.table``). A step's tokens are
flat, sequence after sequence (decodes first, one token each, then prefill chunks); ``query_start``
marks where each sequence's tokens begin and ``seq_lens`` counts its tokens in the cache once this
step's are written. A sequence's new tokens are its last ones, so query ``j`` of ``n`` attends to
keys ``0 .. seq_len - n + j`` (causal, aligned to the end). A layer with a sliding window ``w``
(Mistral's; ``window`` > 0) narrows that to the last ``w`` of them, the query's own key included:
keys ``p - w + 1 .. p`` for the query at position ``p``, as transformers masks
``kv_idx > q_idx - sliding_window``. Every backend takes the window per call, so layers with and
without one share a step.

Each backend is a class in a module of its own (``cpu_kernel``, ``flash_varlen``, ``triton``,
``sdpa_gather``), registered here by name. One is chosen per process (``select_backend``): the
``attention_backend`` setting names one to require it, or ``auto`` takes the first of the device's
backends, fastest first as ``ops.table`` lists them, that runs here.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from frontier_runtime.ops import table
from frontier_runtime.ops.attention.base import (
    AttentionBackend,
    AttentionCall,
    AttentionMetadata,
    RotaryWrite,
)
from frontier_runtime.ops.attention.cpu_kernel import CpuKernelBackend
from frontier_runtime.ops.attention.flash_varlen import FlashVarlenBackend
from frontier_runtime.ops.attention.sdpa_gather import SdpaGatherBackend
from frontier_runtime.ops.attention.triton import TritonBackend

__all__ = [
    "BACKENDS",
    "AttentionBackend",
    "AttentionCall",
    "AttentionMetadata",
    "CpuKernelBackend",
    "FlashVarlenBackend",
    "RotaryWrite",
    "SdpaGatherBackend",
    "TritonBackend",
    "backend",
    "probe",
    "select_backend",
]

log = logging.getLogger("frontier_runtime.ops")

BACKENDS: dict[str, type[AttentionBackend]] = {
    cls.name: cls for cls in (CpuKernelBackend, FlashVarlenBackend, TritonBackend, SdpaGatherBackend)
}
# Runs wherever torch does: what ``auto`` ends on, and what a kernel's probe step is checked against.
PORTABLE = SdpaGatherBackend


def backend(name: str) -> type[AttentionBackend]:
    """The backend registered as ``name``, or ValueError listing those there are."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"attention_backend {name!r} is not one of {', '.join(BACKENDS)}") from None


def select_backend(
    device: torch.device,
    block_size: int,
    dtype: torch.dtype,
    prefer: str = table.AUTO,
    kv_dtype: torch.dtype | None = None,
    window: int = 0,
) -> type[AttentionBackend]:
    """The fastest backend that runs here; ``prefer`` (the ``attention_backend`` setting) requires one.

    ``window``: the model's sliding window (0: none), which the backend must honour."""
    kv = kv_dtype or dtype
    if prefer != table.AUTO:
        required = backend(prefer)
        problem = probe(required, device, block_size, dtype, kv, window)
        if problem:
            raise ValueError(
                f"attention_backend {prefer!r} is required but cannot run on {device}: {problem}"
            )
        return required
    for name in table.attention_backends_on(device.type):
        candidate = BACKENDS[name]
        problem = probe(candidate, device, block_size, dtype, kv, window)
        if not problem:
            return candidate
        log.info("attention backend %s not used: %s", name, problem)
    return PORTABLE


def probe(
    backend: type[AttentionBackend],
    device: torch.device,
    block_size: int,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    window: int = 0,
) -> str:
    """Why ``backend`` cannot run here, or "" if it can (a kernel verified on a probe step: it ran a
    tiny step and agreed with SDPA).

    ``window``: the model's sliding window (0: none); the probe step then attends within a window
    too, small enough to cut its longer sequence."""
    problem = backend.unavailable(device, dtype, kv_dtype)
    if problem or not backend.verified_on_a_probe_step:
        return problem
    return _probe_kernel(backend.name, device, block_size, dtype, kv_dtype, min(window, 5))


@functools.cache  # once per process: a kernel's answer for a shape does not change
def _probe_kernel(
    name: str,
    device: torch.device,
    block_size: int,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    window: int = 0,
) -> str:
    backend = BACKENDS[name]
    try:
        q, k_cache, v_cache, meta = _probe_step(device, block_size, dtype, kv_dtype, backend)
        got = backend.attend(q, k_cache, v_cache, meta, 0.125, window=window)
        want = PORTABLE.forward(AttentionCall(q, k_cache, v_cache, meta, 0.125, window=window))
    except (ImportError, RuntimeError, ValueError, TypeError, NotImplementedError, AssertionError) as exc:
        return (
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} (block_size {block_size})"
        )
    if not torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2):
        return f"its output disagrees with SDPA on a probe step (block_size {block_size})"
    return ""


def _probe_step(
    device: torch.device,
    block_size: int,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    backend: type[AttentionBackend],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A tiny step (a decode-length and a prefill-length sequence, GQA 2:1, blocks out of order),
    in the flash layout every probed kernel reads."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    kvh, heads, hd, nb = 2, 4, 64, 4
    k_cache = torch.randn(nb, block_size, kvh, hd, generator=gen).to(device, dtype).to(kv_dtype)
    v_cache = torch.randn(nb, block_size, kvh, hd, generator=gen).to(device, dtype).to(kv_dtype)
    lens = [3, block_size + 2]
    q = torch.randn(sum(lens), heads, hd, generator=gen).to(device, dtype)
    i32: dict[str, Any] = {"dtype": torch.int32, "device": device}
    tables = torch.tensor([[2, 0], [1, 3]], **i32)
    meta = AttentionMetadata(
        slots=torch.zeros(0, dtype=torch.long, device=device),
        tables=tables,
        rows=torch.tensor([0, 1], **i32),
        query_start=torch.tensor([0, lens[0], sum(lens)], **i32),
        seq_lens=torch.tensor(lens, **i32),
        num_decodes=0,
        max_query_len=max(lens),
        max_seq_len=max(lens),
        backend=backend,
        step_tables=tables,
        cu_seq_k=torch.tensor([0, lens[0], sum(lens)], **i32),
        host_query_lens=lens,
        host_seq_lens=lens,
    )
    return q, k_cache, v_cache, meta
