"""``cpu-kernel``: the C++ paged attention of ``ops.cpu_kernel``, keys read in place through the block
table. Its cache keeps K as ``[num_blocks, kv_heads, head_dim, block_size]`` (a query's scores against
a block are then head_dim vector multiply-adds) and V as ``[num_blocks, kv_heads, block_size,
head_dim]``; the rotary embedding and the cache write are fused into one C++ pass too."""

from __future__ import annotations

import torch
from torch import Tensor

from frontier_runtime.ops import cpu_kernel, table
from frontier_runtime.ops.attention.base import AttentionBackend, AttentionCall, RotaryWrite


class CpuKernelBackend(AttentionBackend):
    traits = table.ATTENTION_BACKENDS["cpu-kernel"]

    @classmethod
    def unavailable(cls, device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype) -> str:
        problem = super().unavailable(device, dtype, kv_dtype)
        if problem or cpu_kernel.load():
            return problem
        return "the native CPU kernels are switched off or not built for this host"

    @classmethod
    def store_kv(cls, k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slots: Tensor) -> None:
        bs = k_cache.shape[3]
        blocks, offsets = slots // bs, slots % bs
        k_cache[blocks, :, :, offsets] = k
        v_cache[blocks, :, offsets, :] = v

    @classmethod
    def can_rotate_into_cache(cls, q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        """The C++ pass writes a cache of q's own dtype, where the native kernels loaded."""
        return k_cache.dtype == q.dtype and q.device.type == "cpu" and cpu_kernel.load()

    @classmethod
    def rotary_and_cache(cls, w: RotaryWrite) -> None:
        # No scales: ``can_rotate_into_cache`` offers it for a cache of q's dtype only.
        torch.ops.frontier.rotary_and_cache(
            w.q, w.k, w.v, w.positions.contiguous(), w.cos, w.sin, w.k_cache, w.v_cache, w.slots.contiguous()
        )

    @classmethod
    def forward(cls, call: AttentionCall) -> torch.Tensor:
        q = call.q
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dense_rows = q.stride(2) == 1 and q.stride(1) == q.shape[2]  # a view into qkv is read in place
        args = (
            out,
            q if dense_rows else q.contiguous(),
            *call.paged_cache(),
            call.scale,
            call.k_scale,
            call.v_scale,
        )
        if call.window:
            torch.ops.frontier.paged_attention_window(*args, call.window)
        else:
            torch.ops.frontier.paged_attention(*args)
        return out
