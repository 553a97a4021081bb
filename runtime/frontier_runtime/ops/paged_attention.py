"""Attention of one step's query tokens over the paged KV cache: one call per layer, every sequence.

Token ``t`` of a sequence lives at slot ``table[t // block_size] * block_size + t % block_size``
of each layer's cache. The cache layout depends on the backend (``allocate_kv``): the
flash-attention paged layout ``[num_blocks, block_size, kv_heads, head_dim]`` for K and V, except
for the CPU kernel, which keeps K as ``[num_blocks, kv_heads, head_dim, block_size]`` (a query's
scores against a block are then head_dim vector multiply-adds) and V as ``[num_blocks, kv_heads,
block_size, head_dim]``. A step's tokens are flat, sequence after sequence (decodes first, one token
each, then prefill chunks); ``query_start`` marks where each sequence's tokens begin and
``seq_lens`` counts its tokens in the cache once this step's are written. A sequence's new tokens
are its last ones, so query ``j`` of ``n`` attends to keys ``0 .. seq_len - n + j`` (causal,
aligned to the end). A layer with a sliding window ``w`` (Mistral's; ``window`` > 0) narrows that to
the last ``w`` of them, the query's own key included: keys ``p - w + 1 .. p`` for the query at
position ``p``, as transformers masks ``kv_idx > q_idx - sliding_window``. Every backend takes the
window per call, so layers with and without one share a step.

Backends, chosen once per process (``select_backend``; ``attention_backend`` in the settings names
one to require it):

- ``cpu-kernel``: the C++ kernel of ``cpu_kernel``; keys read in place through the block table.
- ``flash-varlen``: on CUDA, torch's ``varlen_attn`` with ``block_table`` (FlashAttention's paged
  varlen kernel; GQA native), when this torch's signature has what it needs and the kernel accepts
  this block size (probed once; FlashAttention-2 wants pages of 256 tokens).
- ``triton``: the Triton kernel of ``triton_attention`` (any power-of-two block size from 16, an
  fp8 cache too); on CUDA, or on CPU under ``TRITON_INTERPRET=1`` (tests).
- ``sdpa-gather``: the portable path (no compiler on CPU; CUDA without either kernel): per layer the
  blocks of the step's sequences are gathered into a padded batch and attended with one SDPA call
  for the decodes and one for the prefill chunks. Query heads of a KV head are folded into the
  query rows, so GQA runs on SDPA's efficient kernels, never the math fallback. Its indices and
  masks are built once per step (the first layer) and reused by every layer: no host sync per layer.

The first three read only tensors (no host copies of lengths), so a decode step of theirs can be
captured in a CUDA graph.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from frontier_runtime.ops import cpu_kernel, triton_attention

log = logging.getLogger("frontier_runtime.ops")

BACKENDS = ("cpu-kernel", "flash-varlen", "triton", "sdpa-gather")
# What ``auto`` tries, fastest first, on each device type.
CANDIDATES = {"cpu": ("cpu-kernel", "sdpa-gather"), "cuda": ("flash-varlen", "triton", "sdpa-gather")}


@dataclass
class AttentionMetadata:
    """Where this step's K/V go and what each query reads; built once per step, used by every layer."""

    slots: torch.Tensor  # [num_tokens] int64: cache slot each token's K/V is written to
    tables: torch.Tensor  # [num_rows, max_blocks] int32: every live sequence's block table
    rows: torch.Tensor  # [num_seqs] int32: each sequence's row of ``tables``
    query_start: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    num_decodes: int  # the first sequences, one query token each
    max_query_len: int
    max_seq_len: int
    backend: str
    # flash-varlen: the step's own rows of the table, and cumulative key counts.
    step_tables: torch.Tensor | None = None
    cu_seq_k: torch.Tensor | None = None
    # sdpa-gather: host copies of the lengths, for padding, and the plan the first layer of each
    # window (0: none) builds.
    host_query_lens: list[int] | None = None
    host_seq_lens: list[int] | None = None
    gather: dict[int, list[_GatherGroup]] = field(default_factory=dict, repr=False)


def allocate_kv(
    backend: str,
    num_blocks: int,
    block_size: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's K and V cache in ``backend``'s layout, zeroed (padded reads must not be NaN)."""
    if backend == "cpu-kernel":
        k_shape = (num_blocks, kv_heads, head_dim, block_size)
        v_shape = (num_blocks, kv_heads, block_size, head_dim)
    else:
        k_shape = v_shape = (num_blocks, block_size, kv_heads, head_dim)
    return (
        torch.zeros(k_shape, dtype=dtype, device=device),
        torch.zeros(v_shape, dtype=dtype, device=device),
    )


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Store the step's keys and values ([tokens, kv_heads, head_dim]) at their slots."""
    if k_cache.dtype == torch.float8_e4m3fn:
        # Per-tensor scale: the cache holds value / scale. Copied as bytes: index_copy_ has no fp8 kernel.
        k = (k.float() / k_scale).clamp_(-448.0, 448.0).to(k_cache.dtype).view(torch.uint8)
        v = (v.float() / v_scale).clamp_(-448.0, 448.0).to(v_cache.dtype).view(torch.uint8)
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    if meta.backend == "cpu-kernel":
        bs = k_cache.shape[3]
        blocks, offsets = meta.slots // bs, meta.slots % bs
        k_cache[blocks, :, :, offsets] = k
        v_cache[blocks, :, offsets, :] = v
    else:
        kvh, hd = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, kvh, hd).index_copy_(0, meta.slots, k)
        v_cache.view(-1, kvh, hd).index_copy_(0, meta.slots, v)


def attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    window: int = 0,
) -> torch.Tensor:
    """Attention output for ``q`` ([tokens, heads, head_dim]), same shape and dtype.

    ``k_scale``/``v_scale`` apply to an fp8 cache only (it holds value / scale). ``window`` > 0: each
    query sees its last ``window`` keys only (a sliding window); 0: every earlier key."""
    if window < 0:
        raise ValueError(f"attention window {window} must be >= 0 (0: no window)")
    if k_cache.dtype != torch.float8_e4m3fn:
        k_scale = v_scale = 1.0
    if meta.backend == "cpu-kernel":
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dense_rows = q.stride(2) == 1 and q.stride(1) == q.shape[2]  # a view into qkv is read in place
        args = (
            out,
            q if dense_rows else q.contiguous(),
            k_cache,
            v_cache,
            meta.tables,
            meta.rows,
            meta.query_start,
            meta.seq_lens,
            scale,
            k_scale,
            v_scale,
        )
        if window:
            torch.ops.frontier.paged_attention_window(*args, window)
        else:
            torch.ops.frontier.paged_attention(*args)
        return out
    if meta.backend == "flash-varlen":
        return _flash_varlen(q, k_cache, v_cache, meta, scale, window)
    if meta.backend == "triton":
        return triton_attention.paged_attention(
            q,
            k_cache,
            v_cache,
            meta.tables,
            meta.rows,
            meta.query_start,
            meta.seq_lens,
            meta.max_query_len,
            scale,
            k_scale,
            v_scale,
            window=window,
        )
    return _sdpa_gather(q, k_cache, v_cache, meta, scale, k_scale, v_scale, window)


@functools.cache
def _varlen_entry() -> tuple[Callable[..., Any], frozenset[str]]:
    """torch's paged varlen attention and the keywords this torch's version of it takes."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def _varlen_keywords(params: frozenset[str], causal: bool, gqa: bool, window: int = 0) -> dict[str, Any]:
    """The keywords for this torch's ``varlen_attn``, or NotImplementedError naming what it lacks.

    Its signature has moved between torch releases (``is_causal`` became ``window_size``;
    ``enable_gqa``, ``seqused_k`` and ``block_table`` came later), so they are read off it."""
    missing = {"seqused_k", "block_table", "scale"} - params
    if gqa and "enable_gqa" not in params:
        missing.add("enable_gqa")
    if not ({"window_size", "is_causal"} & params) or (window and "window_size" not in params):
        missing.add("window_size")
    if missing:
        raise NotImplementedError(f"this torch's varlen_attn takes no {', '.join(sorted(missing))}")
    kw: dict[str, Any] = {}
    if window:
        # FlashAttention's (left, right) window, aligned to the end of the keys like its causal
        # mask: key j is seen by the query at position p when p - left <= j <= p.
        kw["window_size"] = (window - 1, 0)
    elif "window_size" in params:
        kw["window_size"] = (-1, 0) if causal else (-1, -1)
    else:
        kw["is_causal"] = causal
    if gqa:
        kw["enable_gqa"] = True
    return kw


def _flash_varlen(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    varlen_attn, params = _varlen_entry()
    # One query per sequence (a decode step) sees every key: no causal window, which lets the
    # kernel pack a KV head's query heads into one tile.
    gqa = q.shape[1] != k_cache.shape[2]
    kw = _varlen_keywords(params, causal=meta.max_query_len > 1, gqa=gqa, window=window)
    out = varlen_attn(
        q,
        k_cache,
        v_cache,
        meta.query_start,
        meta.cu_seq_k,
        meta.max_query_len,
        meta.max_seq_len,
        scale=scale,
        seqused_k=meta.seq_lens,
        block_table=meta.step_tables,
        **kw,
    )
    assert isinstance(out, torch.Tensor)
    return out


@dataclass
class _GatherGroup:
    """One SDPA call's worth of a step (its decodes, or its prefill chunks): which cache blocks
    to gather, where each padded query row comes from, which rows are real, and the mask."""

    t0: int  # the group's tokens are q[t0:t1]
    t1: int
    seqs: int
    max_q: int
    blocks: torch.Tensor  # [seqs * nblocks] long: cache blocks, sequence by sequence
    query_src: torch.Tensor  # [seqs * max_q] long: token of q each padded query row reads
    real_rows: torch.Tensor  # [t1 - t0] long: the padded rows that are real tokens, in order
    mask: torch.Tensor  # [seqs, 1, group * max_q, nblocks * block_size] bool


def _gather_plan(
    meta: AttentionMetadata, group: int, block_size: int, device: torch.device, window: int = 0
) -> list[_GatherGroup]:
    """Built once per step and window from the host copies of the lengths (one host-to-device copy)."""
    assert meta.host_query_lens is not None and meta.host_seq_lens is not None
    qlens, klens, nd = meta.host_query_lens, meta.host_seq_lens, meta.num_decodes
    plan = []
    t0 = 0
    for first, last in ((0, nd), (nd, len(qlens))):
        if first == last:
            continue
        lens, ctx = qlens[first:last], klens[first:last]
        s, max_q, nblocks = len(lens), max(lens), -(-max(ctx) // block_size)
        src, real, starts = [], [], t0
        for j, n in enumerate(lens):
            src.extend(starts + min(i, n - 1) for i in range(max_q))
            real.extend(j * max_q + i for i in range(n))
            starts += n
        host = torch.tensor([*src, *real, *lens, *ctx], dtype=torch.long)
        query_src, real_rows, qlen, klen = host.to(device).split([len(src), len(real), s, s])
        rows = meta.rows[first:last].long()
        blocks = meta.tables.index_select(0, rows)[:, :nblocks].long().reshape(-1)
        # Query i of a sequence sits at position seq_len - query_len + i and sees keys up to it.
        qi = torch.arange(max_q, device=device)
        pos = (klen - qlen).unsqueeze(1) + qi.unsqueeze(0)  # [s, max_q]
        kpos = torch.arange(nblocks * block_size, device=device)
        mask = kpos.view(1, 1, -1) <= pos.unsqueeze(2)  # [s, max_q, keys]
        if window:
            mask &= kpos.view(1, 1, -1) > pos.unsqueeze(2) - window
        padded = qi.unsqueeze(0) >= qlen.unsqueeze(1)
        mask |= padded.unsqueeze(2) & (kpos == 0).view(1, 1, -1)  # padded rows: one key, no NaN
        mask = mask.unsqueeze(1).expand(s, group, max_q, -1).reshape(s, 1, group * max_q, -1)
        plan.append(_GatherGroup(t0, starts, s, max_q, blocks, query_src, real_rows, mask))
        t0 = starts
    return plan


def _sdpa_gather(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    k_scale: float,
    v_scale: float,
    window: int = 0,
) -> torch.Tensor:
    plan = meta.gather.get(window)
    if plan is None:  # the step's first layer with this window
        group = q.shape[1] // k_cache.shape[2]
        plan = meta.gather[window] = _gather_plan(meta, group, k_cache.shape[1], q.device, window)
    out = torch.empty_like(q)
    for g in plan:
        out[g.t0 : g.t1] = _sdpa_group(q, k_cache, v_cache, g, scale, k_scale, v_scale)
    return out


def _sdpa_group(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    g: _GatherGroup,
    scale: float,
    k_scale: float,
    v_scale: float,
) -> torch.Tensor:
    """Sequences padded to one batch: [seqs, kv_heads, group * max_q, head_dim] against their keys."""
    s, max_q = g.seqs, g.max_q
    heads, hd = q.shape[1], q.shape[2]
    bs, kvh = k_cache.shape[1], k_cache.shape[2]
    group = heads // kvh
    keys_len = g.mask.shape[-1]
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8:  # gathered as bytes: index_select has no fp8 kernel
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    keys = k_cache.index_select(0, g.blocks).view(s, keys_len, kvh, hd).transpose(1, 2)
    values = v_cache.index_select(0, g.blocks).view(s, keys_len, kvh, hd).transpose(1, 2)
    if fp8:
        keys = keys.view(torch.float8_e4m3fn).to(q.dtype) * k_scale
        values = values.view(torch.float8_e4m3fn).to(q.dtype) * v_scale
    else:
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    assert keys_len % bs == 0
    # Padded queries: token i of sequence j at [j, :, g * max_q + i] for each of the group's heads.
    qp = q.index_select(0, g.query_src).view(s, max_q, kvh, group, hd)
    qp = qp.permute(0, 2, 3, 1, 4).reshape(s, kvh, group * max_q, hd)
    o = F.scaled_dot_product_attention(qp, keys, values, attn_mask=g.mask, scale=scale)
    o = o.view(s, kvh, group, max_q, hd).permute(0, 3, 1, 2, 4).reshape(s * max_q, heads, hd)
    return o.index_select(0, g.real_rows)


def _probe_step(
    device: torch.device, block_size: int, dtype: torch.dtype, kv_dtype: torch.dtype, backend: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A tiny step (a decode-length and a prefill-length sequence, GQA 2:1, blocks out of order)."""
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


def probe(
    backend: str,
    device: torch.device,
    block_size: int,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    window: int = 0,
) -> str:
    """Why ``backend`` cannot run here, or "" if it can (a kernel: it ran a tiny step and agreed with SDPA).

    ``window``: the model's sliding window (0: none); the probe step then attends within a window
    too, small enough to cut its longer sequence."""
    if backend == "sdpa-gather":
        return ""
    if backend == "cpu-kernel":
        if device.type != "cpu":
            return "it runs on CPU hosts only"
        return (
            "" if cpu_kernel.load() else "the native CPU kernels are switched off or not built for this host"
        )
    if backend == "flash-varlen":
        if device.type != "cuda":
            return "it needs a CUDA device"
        if kv_dtype == torch.float8_e4m3fn:
            return "FlashAttention reads no fp8 KV cache"
    if backend == "triton" and not triton_attention.available(device):
        return "Triton is not installed, or the device is neither CUDA nor a CPU under TRITON_INTERPRET=1"
    return _probe_kernel(backend, device, block_size, dtype, kv_dtype, min(window, 5))


@functools.cache  # once per process: a kernel's answer for a shape does not change
def _probe_kernel(
    backend: str,
    device: torch.device,
    block_size: int,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    window: int = 0,
) -> str:
    try:
        q, k_cache, v_cache, meta = _probe_step(device, block_size, dtype, kv_dtype, backend)
        got = attend(q, k_cache, v_cache, meta, 0.125, window=window)
        want = _sdpa_gather(q, k_cache, v_cache, meta, 0.125, 1.0, 1.0, window)
    except (ImportError, RuntimeError, ValueError, TypeError, NotImplementedError, AssertionError) as exc:
        return (
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} (block_size {block_size})"
        )
    if not torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2):
        return f"its output disagrees with SDPA on a probe step (block_size {block_size})"
    return ""


def select_backend(
    device: torch.device,
    block_size: int,
    dtype: torch.dtype,
    prefer: str = "auto",
    kv_dtype: torch.dtype | None = None,
    window: int = 0,
) -> str:
    """The fastest backend that runs here; ``prefer`` (the ``attention_backend`` setting) requires one.

    ``window``: the model's sliding window (0: none), which the backend must honour."""
    kv = kv_dtype or dtype
    if prefer != "auto":
        if prefer not in BACKENDS:
            raise ValueError(f"attention_backend {prefer!r} is not one of {', '.join(BACKENDS)}")
        problem = probe(prefer, device, block_size, dtype, kv, window)
        if problem:
            raise ValueError(
                f"attention_backend {prefer!r} is required but cannot run on {device}: {problem}"
            )
        return prefer
    for backend in CANDIDATES.get(device.type, ("sdpa-gather",)):
        problem = probe(backend, device, block_size, dtype, kv, window)
        if not problem:
            return backend
        log.info("attention backend %s not used: %s", backend, problem)
    return "sdpa-gather"
