"""Grouped-query attention over the paged KV cache.

Tokens of one step are flat (``[num_tokens, hidden]``): decode tokens first (one per sequence),
then each prefill chunk. K/V are written at their slots and every query token attends in one call
per layer, through the step's attention backend (``ops.attention``: a C++ kernel on CPU, a paged
flash or Triton kernel on CUDA, SDPA over gathered blocks where neither is available). A layer with a sliding window (Mistral's,
some Qwen layers) passes it to that call: its queries see their last ``window`` keys only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from frontier_runtime.distributed import TPGroup
from frontier_runtime.models.llama.config import LlamaConfig
from frontier_runtime.models.llama.layers import Linear, RMSNorm
from frontier_runtime.ops import fused
from frontier_runtime.ops.attention import AttentionMetadata, RotaryWrite

__all__ = ["Attention", "AttentionMetadata", "Rope"]


@dataclass
class Rope:
    """A step's token positions and the model's rotary tables ([max_positions, head_dim], float32)."""

    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    _gathered: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def apply(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated copies of q and k (the torch path; the rows of the tables gathered once a step)."""
        if q.dtype not in self._gathered:
            c = self.cos[self.positions].to(q.dtype).unsqueeze(1)
            s = self.sin[self.positions].to(q.dtype).unsqueeze(1)
            self._gathered[q.dtype] = (c, s)
        c, s = self._gathered[q.dtype]
        return q * c + fused.rotate_half(q) * s, k * c + fused.rotate_half(k) * s


class Attention(nn.Module):
    """Each rank holds its share of the query and KV heads; ``o_proj`` is row-parallel."""

    def __init__(self, cfg: LlamaConfig, tp: TPGroup, window: int = 0) -> None:
        super().__init__()
        self.tp = tp
        self.window = window  # keys each query sees, its own included; 0: the whole context
        self.num_heads = cfg.num_heads // tp.world_size
        self.num_kv_heads = cfg.num_kv_heads // tp.world_size
        self.head_dim = cfg.head_dim
        self.group = self.num_heads // self.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        # q, k and v fused into one column-parallel matmul: one kernel instead of three per layer.
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=False)
        # Qwen3: each head of q and k is RMS-normalised (one weight over head_dim) before RoPE.
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        # fp8 KV cache only: the cache holds k / k_scale (set by the model runner from kv_bound).
        self.k_scale = 1.0
        self.v_scale = 1.0

    def kv_bound(self, norm_weight: torch.Tensor) -> tuple[float, float]:
        """Bounds on |k| and |v| this layer can ever write, from its weights alone.

        The projection's input is RMSNorm output: its L2 norm is at most sqrt(hidden) * max|gamma|,
        so |k_i| <= ||W_k[i]|| * that (+ |bias|), and RoPE mixes pairs of features, at most sqrt(2)
        more. An fp8 cache scaled by bound / 448 can therefore never overflow; e4m3's relative
        precision is the same anywhere in its normal range, so the loose bound costs nothing but
        values below bound / 2**15, which are too small to matter in softmax(qk) v. Where k is
        itself RMS-normalised per head (Qwen3), |k_i| <= sqrt(head_dim) * max|k_norm|, whatever W_k.
        """
        proj = self.qkv_proj
        w = proj.dense_weight().float()[self.q_size :]
        x_norm = norm_weight.float().abs().max() * norm_weight.shape[0] ** 0.5
        rows = w.norm(dim=1) * x_norm
        if proj.bias is not None:
            rows = rows + proj.bias.float()[self.q_size :].abs()
        k_rows, v_rows = rows.split(self.kv_size)
        k_max = float(k_rows.max())
        if self.k_norm is not None:
            k_max = float(self.k_norm.weight.float().abs().max()) * self.head_dim**0.5
        return k_max * 2**0.5, float(v_rows.max())

    def forward(
        self,
        x: torch.Tensor,
        rope: Rope,
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
        if self.q_norm is not None and self.k_norm is not None:
            # Contiguous copies, so the fused norm runs (it also leaves q rotatable in place).
            q = self.q_norm(q.contiguous())[0]
            k = self.k_norm(k.contiguous())[0]
        backend = meta.backend
        if backend.can_rotate_into_cache(q, k_cache):
            # q is rotated where it lies in the projection's output and read from there.
            backend.rotary_and_cache(
                RotaryWrite(
                    q,
                    k,
                    v,
                    rope.positions,
                    rope.cos,
                    rope.sin,
                    k_cache,
                    v_cache,
                    meta.slots,
                    self.k_scale,
                    self.v_scale,
                )
            )
        else:
            q, k = rope.apply(q, k)
            backend.write_kv(k_cache, v_cache, k, v, meta, self.k_scale, self.v_scale)
        out = backend.attend(q, k_cache, v_cache, meta, hd**-0.5, self.k_scale, self.v_scale, self.window)
        return self.tp.all_reduce(self.o_proj(out.view(n, self.q_size)))
