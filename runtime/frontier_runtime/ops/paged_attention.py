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
aligned to the end).

Backends, chosen once per process (``select_backend``):

- ``cpu-kernel``: the C++ kernel of ``cpu_kernel``; keys read in place through the block table.
- ``flash-varlen``: on CUDA, torch's ``varlen_attn`` with ``block_table`` (FlashAttention's paged
  varlen kernel; GQA native), when this torch and this block size support it (probed once).
- ``sdpa-gather``: the portable path (no compiler on CPU; CUDA without the paged kernel): per
  layer the blocks of the step's sequences are gathered into a padded batch and attended with one
  SDPA call for the decodes and one for the prefill chunks. Query heads of a KV head are folded
  into the query rows, so GQA runs on SDPA's efficient kernels, never the math fallback.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from frontier_runtime.ops import cpu_kernel

log = logging.getLogger("frontier_runtime.ops")

BACKENDS = ("cpu-kernel", "flash-varlen", "sdpa-gather")


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
    # sdpa-gather: host copies of the lengths, for padding.
    host_query_lens: list[int] | None = None
    host_seq_lens: list[int] | None = None


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
) -> torch.Tensor:
    """Attention output for ``q`` ([tokens, heads, head_dim]), same shape and dtype.

    ``k_scale``/``v_scale`` apply to an fp8 cache only (it holds value / scale)."""
    if k_cache.dtype != torch.float8_e4m3fn:
        k_scale = v_scale = 1.0
    if meta.backend == "cpu-kernel":
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dense_rows = q.stride(2) == 1 and q.stride(1) == q.shape[2]  # a view into qkv is read in place
        torch.ops.frontier.paged_attention(
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
        return out
    if meta.backend == "flash-varlen":
        from torch.nn.attention.varlen import varlen_attn

        return varlen_attn(
            q,
            k_cache,
            v_cache,
            meta.query_start,
            meta.cu_seq_k,
            meta.max_query_len,
            meta.max_seq_len,
            scale=scale,
            window_size=(-1, 0),
            enable_gqa=q.shape[1] != k_cache.shape[2],
            seqused_k=meta.seq_lens,
            block_table=meta.step_tables,
        )
    return _sdpa_gather(q, k_cache, v_cache, meta, scale, k_scale, v_scale)


def _sdpa_gather(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    k_scale: float,
    v_scale: float,
) -> torch.Tensor:
    assert meta.host_query_lens is not None and meta.host_seq_lens is not None
    out = torch.empty_like(q)
    nd = meta.num_decodes
    groups = [(0, nd), (nd, len(meta.host_query_lens))]
    bounds = [0]
    for n in meta.host_query_lens:
        bounds.append(bounds[-1] + n)
    for first, last in groups:
        if first == last:
            continue
        lens = meta.host_query_lens[first:last]
        ctx = meta.host_seq_lens[first:last]
        t0, t1 = bounds[first], bounds[last]
        out[t0:t1] = _sdpa_group(
            q[t0:t1], k_cache, v_cache, meta.tables, meta.rows[first:last], lens, ctx, scale, k_scale, v_scale
        )
    return out


def _sdpa_group(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    rows: torch.Tensor,
    query_lens: list[int],
    seq_lens: list[int],
    scale: float,
    k_scale: float,
    v_scale: float,
) -> torch.Tensor:
    """Sequences padded to one batch: [seqs, kv_heads, group * max_q, head_dim] against their keys."""
    dev = q.device
    s, heads, hd = len(query_lens), q.shape[1], q.shape[2]
    bs, kvh = k_cache.shape[1], k_cache.shape[2]
    group = heads // kvh
    max_q, max_k = max(query_lens), max(seq_lens)
    nblocks = -(-max_k // bs)
    blocks = tables.index_select(0, rows)[:, :nblocks].long()  # [s, nblocks]
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8:  # gathered as bytes: index_select has no fp8 kernel
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    keys = k_cache.index_select(0, blocks.view(-1)).view(s, nblocks * bs, kvh, hd).transpose(1, 2)
    values = v_cache.index_select(0, blocks.view(-1)).view(s, nblocks * bs, kvh, hd).transpose(1, 2)
    if fp8:
        keys = keys.view(torch.float8_e4m3fn).to(q.dtype) * k_scale
        values = values.view(torch.float8_e4m3fn).to(q.dtype) * v_scale
    else:
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    qlens = torch.tensor(query_lens, device=dev)
    slens = torch.tensor(seq_lens, device=dev)
    # Padded queries: token i of sequence j at [j, :, g * max_q + i] for each of the group's heads.
    starts = torch.cumsum(qlens, 0) - qlens
    qi = torch.arange(max_q, device=dev)
    valid_q = qi.unsqueeze(0) < qlens.unsqueeze(1)  # [s, max_q]
    src = (starts.unsqueeze(1) + qi.unsqueeze(0)).clamp_(max=q.shape[0] - 1)  # [s, max_q]
    qp = q.index_select(0, src.view(-1)).view(s, max_q, kvh, group, hd)
    qp = qp.permute(0, 2, 3, 1, 4).reshape(s, kvh, group * max_q, hd)
    # Query i of a sequence sits at position seq_len - query_len + i and sees keys up to it.
    pos = (slens - qlens).unsqueeze(1) + qi.unsqueeze(0)  # [s, max_q]
    kpos = torch.arange(nblocks * bs, device=dev)
    mask = kpos.view(1, 1, -1) <= pos.unsqueeze(2)  # [s, max_q, keys]
    mask |= ~valid_q.unsqueeze(2) & (kpos == 0).view(1, 1, -1)  # padded rows: one key, no NaN
    mask = mask.unsqueeze(1).expand(s, group, max_q, -1).reshape(s, 1, group * max_q, -1)
    o = F.scaled_dot_product_attention(qp, keys, values, attn_mask=mask, scale=scale)
    o = o.view(s, kvh, group, max_q, hd).permute(0, 3, 1, 2, 4).reshape(s * max_q, heads, hd)
    return o[valid_q.view(-1)]


def _flash_varlen_works(device: torch.device, block_size: int, dtype: torch.dtype) -> bool:
    """Probe the paged varlen kernel once on a tiny problem against the gather path."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        kvh, heads, hd, nb = 2, 4, 64, 4
        k_cache = torch.randn(nb, block_size, kvh, hd, generator=gen).to(device, dtype)
        v_cache = torch.randn(nb, block_size, kvh, hd, generator=gen).to(device, dtype)
        lens = [3, block_size + 2]
        q = torch.randn(sum(lens), heads, hd, generator=gen).to(device, dtype)
        i32 = dict(dtype=torch.int32, device=device)
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
            backend="flash-varlen",
            step_tables=tables,
            cu_seq_k=torch.tensor([0, lens[0], sum(lens)], **i32),
            host_query_lens=lens,
            host_seq_lens=lens,
        )
        got = attend(q, k_cache, v_cache, meta, hd**-0.5)
        want = _sdpa_gather(q, k_cache, v_cache, meta, hd**-0.5, 1.0, 1.0)
        ok = torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)
        if not ok:
            log.warning("paged varlen attention disagrees with SDPA on a probe; not using it")
        return ok
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        log.info("paged varlen attention unavailable at block size %d: %s", block_size, exc)
        return False


def select_backend(device: torch.device, block_size: int, dtype: torch.dtype, prefer: str = "auto") -> str:
    """The fastest backend that works here (``prefer`` forces one, for tests and A/B checks)."""
    if prefer != "auto":
        if prefer not in BACKENDS:
            raise ValueError(f"attention backend {prefer!r} is not one of {', '.join(BACKENDS)}")
        if prefer == "cpu-kernel" and (device.type != "cpu" or not cpu_kernel.load()):
            raise ValueError("attention backend 'cpu-kernel' needs a CPU device and a C++ compiler")
        if prefer == "flash-varlen" and device.type != "cuda":
            raise ValueError("attention backend 'flash-varlen' needs a CUDA device")
        return prefer
    if device.type == "cpu":
        return "cpu-kernel" if cpu_kernel.load() else "sdpa-gather"
    if device.type == "cuda" and _flash_varlen_works(device, block_size, dtype):
        return "flash-varlen"
    return "sdpa-gather"
