"""Grouped-query attention over the paged KV cache, and the metadata that says where K/V go.

Tokens of one step are flat (``[num_tokens, hidden]``): decode tokens first (one per sequence),
then each prefill chunk. Attention is torch's ``scaled_dot_product_attention`` (or a hand-written
softmax for in-place decodes on CPU), so the same code runs on CPU and CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from frontier_runtime.distributed import TPGroup
from frontier_runtime.models.llama.config import LlamaConfig
from frontier_runtime.models.llama.layers import Linear, rotate_half


@dataclass
class PrefillChunk:
    """One sequence's chunk of query tokens in this step."""

    start: int  # index of its first token in the flat batch
    length: int
    context_before: int  # tokens already in the cache ahead of this chunk
    head_blocks: torch.Tensor | None  # [kv_heads * blocks] rows of the head-block view; None if no context
    mask: torch.Tensor | None  # [length, context_before + length] bool; None = plain causal


@dataclass
class DecodeGroup:
    """Decode tokens ``start .. start + count`` (one per sequence) with similar context lengths."""

    start: int
    count: int
    head_blocks: torch.Tensor  # [count * kv_heads * max_blocks] rows of the head-block view
    mask: torch.Tensor | None  # [count, 1, 1, max_blocks * block_size] bool; None = every key valid


@dataclass
class AttentionMetadata:
    """Where this step's K/V go and what each query reads.

    The cache of a layer is ``[kv_heads, num_blocks, block_size, head_dim]``: one (head, block) is a
    contiguous ``[block_size, head_dim]`` tile, so gathering a sequence's tiles head by head gives
    ``[kv_heads, tokens, head_dim]`` directly in the layout attention wants, with no transpose; and
    a sequence whose blocks are consecutive is already ``[kv_heads, tokens, head_dim]`` in place (a
    strided view), so its decode token attends with no copy at all.
    """

    write_index: torch.Tensor  # [num_tokens * kv_heads] rows of the flat [*, head_dim] cache view
    # Decode tokens 0 .. len-1 whose blocks are consecutive: (first cache row, context length).
    decode_spans: list[tuple[int, int]] = field(default_factory=list)
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)


class Attention(nn.Module):
    """Each rank holds its share of the query and KV heads; ``o_proj`` is row-parallel."""

    def __init__(self, cfg: LlamaConfig, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.num_heads = cfg.num_heads // tp.world_size
        self.num_kv_heads = cfg.num_kv_heads // tp.world_size
        self.head_dim = cfg.head_dim
        self.group = self.num_heads // self.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        # q, k and v fused into one column-parallel matmul: one kernel instead of three per layer.
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        n = x.shape[0]
        hd, kvh = self.head_dim, self.num_kv_heads
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n, self.num_heads, hd)
        k = k.view(n, kvh, hd)
        v = v.view(n, kvh, hd)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin

        # k_cache/v_cache: [kv_heads, num_blocks, block_size, head_dim]; see AttentionMetadata.
        k_cache.view(-1, hd).index_copy_(0, meta.write_index, k.reshape(-1, hd).to(k_cache.dtype))
        v_cache.view(-1, hd).index_copy_(0, meta.write_index, v.reshape(-1, hd).to(v_cache.dtype))
        k_tiles = k_cache.view(-1, k_cache.shape[2], hd)
        v_tiles = v_cache.view(-1, v_cache.shape[2], hd)

        out = torch.empty_like(q)
        if meta.decode_spans:
            # Consecutive blocks: attend to the cache in place. Reading K/V once instead of gathering a
            # copy first is worth a few small kernels per sequence; softmax(q k^T) v by hand, since
            # SDPA's CPU kernel costs ~0.1 ms a call at this size (decode rows, no mask needed).
            k_rows, v_rows = k_cache.view(kvh, -1, hd), v_cache.view(kvh, -1, hd)
            if k_rows.dtype != q.dtype:
                k_rows, v_rows = None, None  # converted per sequence below
            keys_t = None if k_rows is None else k_rows.transpose(1, 2)  # [kv_heads, head_dim, rows]
            nd = len(meta.decode_spans)
            queries = (q[:nd] * hd**-0.5).view(nd, kvh, self.group, hd).unbind(0)
            outs = []
            for qi, (first, ctx) in zip(queries, meta.decode_spans, strict=True):
                end = first + ctx
                if keys_t is None:  # the cache has its own dtype
                    kd = k_cache.view(kvh, -1, hd)[:, first:end].to(q.dtype).transpose(1, 2)
                    vd = v_cache.view(kvh, -1, hd)[:, first:end].to(q.dtype)
                else:
                    kd, vd = keys_t[:, :, first:end], v_rows[:, first:end]
                scores = torch.bmm(qi, kd)
                if scores.dtype == torch.float32:
                    weights = torch.softmax(scores, dim=-1)
                else:  # softmax in float32, as SDPA does
                    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
                outs.append(torch.bmm(weights, vd))
            out[:nd] = torch.stack(outs).view(nd, self.num_heads, hd)
        for grp in meta.decode_groups:
            s, c = grp.start, grp.count
            kb = k_tiles.index_select(0, grp.head_blocks).view(c, kvh, -1, hd).to(q.dtype)
            vb = v_tiles.index_select(0, grp.head_blocks).view(c, kvh, -1, hd).to(q.dtype)
            # Grouped-query trick: the `group` query heads of one KV head are its query rows.
            qd = q[s : s + c].view(c, kvh, self.group, hd)
            o = F.scaled_dot_product_attention(qd, kb, vb, attn_mask=grp.mask)
            out[s : s + c] = o.reshape(c, self.num_heads, hd)
        for chunk in meta.prefills:
            s, ln = chunk.start, chunk.length
            qp = q[s : s + ln].transpose(0, 1).unsqueeze(0)
            if chunk.head_blocks is None:
                kp = k[s : s + ln].transpose(0, 1).unsqueeze(0)
                vp = v[s : s + ln].transpose(0, 1).unsqueeze(0)
            else:
                total = chunk.context_before + ln
                kp = k_tiles.index_select(0, chunk.head_blocks).view(1, kvh, -1, hd)[:, :, :total].to(q.dtype)
                vp = v_tiles.index_select(0, chunk.head_blocks).view(1, kvh, -1, hd)[:, :, :total].to(q.dtype)
            o = F.scaled_dot_product_attention(
                qp, kp, vp, attn_mask=chunk.mask, is_causal=chunk.mask is None, enable_gqa=self.group > 1
            )
            out[s : s + ln] = o[0].transpose(0, 1)
        return self.tp.all_reduce(self.o_proj(out.view(n, self.q_size)))
