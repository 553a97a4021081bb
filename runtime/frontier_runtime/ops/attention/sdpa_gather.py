"""``sdpa-gather``: the portable path (no compiler on CPU; CUDA without either kernel). Per layer the
blocks of the step's sequences are gathered into a padded batch and attended with one SDPA call for
the decodes and one for the prefill chunks. Query heads of a KV head are folded into the query rows,
so GQA runs on SDPA's efficient kernels, never the math fallback. Its indices and masks are built
once per step (the first layer of each window) from host copies of the lengths and reused by every
layer: no host sync per layer, but a captured graph would freeze them."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from frontier_runtime.ops import table
from frontier_runtime.ops.attention.base import (
    FP8,
    AttentionBackend,
    AttentionCall,
    AttentionMetadata,
    GatherGroup,
)


class SdpaGatherBackend(AttentionBackend):
    traits = table.ATTENTION_BACKENDS["sdpa-gather"]

    @classmethod
    def complete_metadata(cls, meta: AttentionMetadata, query_lens: list[int], seq_lens: list[int]) -> None:
        meta.host_query_lens = list(query_lens)
        meta.host_seq_lens = list(seq_lens)

    @classmethod
    def forward(cls, call: AttentionCall) -> torch.Tensor:
        q, k_cache, meta, window = call.q, call.k_cache, call.meta, call.window
        plan = meta.gather.get(window)
        if plan is None:  # the step's first layer with this window
            group = q.shape[1] // k_cache.shape[2]
            plan = meta.gather[window] = gather_plan(meta, group, k_cache.shape[1], q.device, window)
        out = torch.empty_like(q)
        for g in plan:
            out[g.t0 : g.t1] = _sdpa_group(call, g)
        return out


def gather_plan(
    meta: AttentionMetadata, group: int, block_size: int, device: torch.device, window: int = 0
) -> list[GatherGroup]:
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
        plan.append(GatherGroup(t0, starts, s, max_q, blocks, query_src, real_rows, mask))
        t0 = starts
    return plan


def _sdpa_group(call: AttentionCall, g: GatherGroup) -> torch.Tensor:
    """Sequences padded to one batch: [seqs, kv_heads, group * max_q, head_dim] against their keys."""
    q, k_cache, v_cache = call.q, call.k_cache, call.v_cache
    s, max_q = g.seqs, g.max_q
    heads, hd = q.shape[1], q.shape[2]
    bs, kvh = k_cache.shape[1], k_cache.shape[2]
    group = heads // kvh
    keys_len = g.mask.shape[-1]
    fp8 = k_cache.dtype == FP8
    if fp8:  # gathered as bytes: index_select has no fp8 kernel
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    keys = k_cache.index_select(0, g.blocks).view(s, keys_len, kvh, hd).transpose(1, 2)
    values = v_cache.index_select(0, g.blocks).view(s, keys_len, kvh, hd).transpose(1, 2)
    if fp8:
        keys = keys.view(FP8).to(q.dtype) * call.k_scale
        values = values.view(FP8).to(q.dtype) * call.v_scale
    else:
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    assert keys_len % bs == 0
    # Padded queries: token i of sequence j at [j, :, g * max_q + i] for each of the group's heads.
    qp = q.index_select(0, g.query_src).view(s, max_q, kvh, group, hd)
    qp = qp.permute(0, 2, 3, 1, 4).reshape(s, kvh, group * max_q, hd)
    o = F.scaled_dot_product_attention(qp, keys, values, attn_mask=g.mask, scale=call.scale)
    o = o.view(s, kvh, group, max_q, hd).permute(0, 3, 1, 2, 4).reshape(s * max_q, heads, hd)
    return o.index_select(0, g.real_rows)
