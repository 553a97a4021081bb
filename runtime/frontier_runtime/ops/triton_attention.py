"""Paged attention in Triton: one step's query tokens over the paged KV cache, all sequences at once.

The cache is ``[num_blocks, block_size, kv_heads, head_dim]`` for K and V; token ``t`` of a sequence
sits at ``cache[tables[row, t // block_size], t % block_size]``. A sequence's query tokens are its
last ones, so query ``j`` of ``n`` attends keys ``0 .. seq_len - n + j`` (causal, aligned to the end);
with a sliding window ``w`` > 0, only the last ``w`` of them (keys ``p - w + 1 .. p`` for the query at
position ``p``), and key tiles before the tile's first query's window are skipped.
An fp8 cache holds value / scale and is dequantised as it is read.

One program handles one sequence, one KV head and a tile of that sequence's queries; the query heads
sharing the KV head are folded into the tile's rows (query tokens x group heads), so each K/V tile is
loaded once per KV head and ``tl.dot`` sees at least 16 rows even for a GQA decode. Softmax is online
(running max and sum in fp32) over the key tiles the tile's last query can see.

The grid comes only from host ints (number of sequences, KV heads, the step's longest query) and the
lengths are read from device tensors inside the kernel, with programs past their sequence's queries
exiting at once: nothing syncs with the host, so a step can be captured in a CUDA graph and replayed
with new lengths and block tables.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch


@functools.cache
def _triton() -> Any:
    """Triton, imported on first use so this module loads on hosts without it."""
    import triton

    return triton


def available(device: torch.device | str | None = None) -> bool:
    """Whether the kernel can run on ``device``: Triton importable, and CUDA (or CPU under its interpreter)."""
    kind = (
        torch.device(device).type if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    # Checked before importing Triton: it reads TRITON_INTERPRET once, when first imported.
    if not (kind == "cuda" or (kind == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")):
        return False
    try:
        _triton()
    except ImportError:
        return False
    return True


@functools.cache
def _kernel() -> Any:
    """The compiled kernel, defined on first use (Triton reads TRITON_INTERPRET when it is defined)."""
    triton = _triton()
    import triton.language as tl

    @triton.jit
    def paged_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        o_ptr,
        tables_ptr,
        rows_ptr,
        query_start_ptr,
        seq_lens_ptr,
        stride_qt,
        stride_qh,
        stride_qd,
        stride_ot,
        stride_oh,
        stride_od,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_kd,
        stride_vb,
        stride_vs,
        stride_vh,
        stride_vd,
        stride_table,
        scale_log2,
        k_scale,
        v_scale,
        window,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_N: tl.constexpr,
        PAGE: tl.constexpr,
        FP8: tl.constexpr,
        SLIDING: tl.constexpr,
        PRECISION: tl.constexpr,
        DOT_FP32: tl.constexpr,
    ):
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        tile = tl.program_id(2)
        q_begin = tl.load(query_start_ptr + seq)
        q_len = tl.load(query_start_ptr + seq + 1) - q_begin
        # The grid is sized for the step's longest query; shorter sequences leave tiles idle.
        if tile * BLOCK_Q >= q_len:
            return
        seq_len = tl.load(seq_lens_ptr + seq)
        row = tl.load(rows_ptr + seq).to(tl.int64)

        # Tile row m is query token tile * BLOCK_Q + m // GROUP_PAD of head m % GROUP_PAD of the group.
        offs_m = tl.arange(0, BLOCK_Q * GROUP_PAD)
        q_idx = tile * BLOCK_Q + offs_m // GROUP_PAD
        group_head = offs_m % GROUP_PAD
        row_ok = (q_idx < q_len) & (group_head < GROUP)
        head = kv_head * GROUP + group_head
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        q_tok = (q_begin + q_idx).to(tl.int64)
        q = tl.load(
            q_ptr + q_tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
            mask=row_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        if DOT_FP32:
            q = q.to(tl.float32)
        # Without a window every row's position is >= 0, so each row sees key 0 and its running max
        # is finite after the first tile (padded rows included): no NaN from an all-masked row.
        # With one, a row may see no key of a tile before its window: it is kept out of its sums.
        pos = seq_len - q_len + q_idx
        keys_end = seq_len - q_len + tl.minimum(tile * BLOCK_Q + BLOCK_Q, q_len)
        keys_begin = 0
        if SLIDING:
            # Key tiles start on BLOCK_N boundaries, before the tile's first query's window.
            keys_begin = tl.maximum(seq_len - q_len + tile * BLOCK_Q - window + 1, 0) // BLOCK_N * BLOCK_N

        m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_Q * GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([BLOCK_Q * GROUP_PAD, BLOCK_D], dtype=tl.float32)
        table_row = tables_ptr + row * stride_table
        for start in range(keys_begin, keys_end, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_ok = offs_n < keys_end
            # A key tile may span several pages (or part of one): each key finds its own block.
            block = tl.load(table_row + offs_n // PAGE, mask=n_ok, other=0).to(tl.int64)
            slot = offs_n % PAGE
            kv_ok = d_ok[:, None] & n_ok[None, :]
            k = tl.load(
                k_ptr
                + block[None, :] * stride_kb
                + slot[None, :] * stride_ks
                + kv_head * stride_kh
                + offs_d[:, None] * stride_kd,
                mask=kv_ok,
                other=0.0,
            )
            v = tl.load(
                v_ptr
                + block[:, None] * stride_vb
                + slot[:, None] * stride_vs
                + kv_head * stride_vh
                + offs_d[None, :] * stride_vd,
                mask=kv_ok.T,
                other=0.0,
            )
            if FP8:
                k = k.to(tl.float8e4nv, bitcast=True).to(tl.float32) * k_scale
                v = v.to(tl.float8e4nv, bitcast=True).to(tl.float32) * v_scale
            k = k.to(q.dtype)
            v = v.to(q.dtype)
            # Scores in log2 units: exp2 is the cheap instruction.
            s = tl.dot(q, k, input_precision=PRECISION) * scale_log2
            if SLIDING:
                seen = (offs_n[None, :] <= pos[:, None]) & (offs_n[None, :] > pos[:, None] - window)
                s = tl.where(seen, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                # A row that has seen no key yet keeps m = -inf: shifting by 0 instead gives it
                # alpha 0 and p 0 (its sums are still 0), where -inf - -inf would be NaN.
                m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_shift)
                p = tl.exp2(s - m_shift[:, None])
            else:
                s = tl.where(offs_n[None, :] <= pos[:, None], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.exp2(m_i - m_new)
                p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new

        if SLIDING:  # a padded row past its sequence may see no key of its window: no 0 / 0
            l_i = tl.where(l_i > 0, l_i, 1.0)
        out = acc / l_i[:, None]
        tl.store(
            o_ptr + q_tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :] * stride_od,
            out.to(o_ptr.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )

    return paged_attention_kernel


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    rows: torch.Tensor,
    query_start: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
    window: int = 0,
) -> torch.Tensor:
    """Attention of ``q`` ([tokens, heads, head_dim]) over the paged cache; same shape, q's dtype.

    ``k_scale``/``v_scale`` dequantise an fp8 cache (it holds value / scale); ignored otherwise.
    ``window`` > 0: each query sees its last ``window`` keys only; 0: every earlier key."""
    triton = _triton()
    tokens, heads, head_dim = q.shape
    page, kv_heads = k_cache.shape[1], k_cache.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not split over {kv_heads} KV heads")
    if page & (page - 1):
        raise ValueError(f"block_size {page} is not a power of two")
    if window < 0:
        raise ValueError(f"attention window {window} must be >= 0 (0: no window)")
    if out is None:
        out = torch.empty((tokens, heads, head_dim), dtype=q.dtype, device=q.device)
    num_seqs = rows.shape[0]
    if tokens == 0 or num_seqs == 0:
        return out
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8:
        # Read as bytes and bitcast in the kernel: the same code on every Triton backend.
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    else:
        k_scale = v_scale = 1.0

    group = heads // kv_heads
    group_pad = _next_pow2(group)
    block_d = max(16, _next_pow2(head_dim))
    # Tile rows (queries x group heads): 16 for a decode step, more for prefill where queries share
    # keys; fewer when the head dim is wide, so the fp32 accumulator stays in registers.
    rows_wanted = 16 if max_query_len == 1 else (64 if block_d <= 128 else 32)
    block_q = max(1, rows_wanted // group_pad)
    # Key tile: 64 keys (several small pages, or part of a large one), never under 16 for tl.dot.
    block_n = 64 if block_d <= 128 else 32
    grid = (num_seqs, kv_heads, triton.cdiv(max(1, max_query_len), block_q))
    _kernel()[grid](
        q,
        k_cache,
        v_cache,
        out,
        tables,
        rows,
        query_start,
        seq_lens,
        *q.stride(),
        *out.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        tables.stride(0),
        scale * 1.4426950408889634,  # log2(e): the kernel exponentiates in base 2
        float(k_scale),
        float(v_scale),
        int(window),
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        PAGE=page,
        FP8=fp8,
        SLIDING=window > 0,  # the kernel without a window compiles without its masks
        # fp32 inputs keep full precision on the tensor cores (tf32 would lose ~3 digits).
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        # The interpreter's tl.dot multiplies bf16/fp16 operands as raw bits: give it fp32 ones.
        DOT_FP32=os.environ.get("TRITON_INTERPRET") == "1",
        num_warps=4,
    )
    return out
