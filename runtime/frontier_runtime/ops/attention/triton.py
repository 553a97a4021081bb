"""``triton``: the paged kernel of ``ops.triton_attention`` (any power-of-two block size from 16, an
fp8 cache too). It serves on CUDA; under ``TRITON_INTERPRET=1`` it also runs on CPU tensors (tests)."""

from __future__ import annotations

import torch

from frontier_runtime.ops import table, triton_attention
from frontier_runtime.ops.attention.base import AttentionBackend, AttentionCall


class TritonBackend(AttentionBackend):
    traits = table.ATTENTION_BACKENDS["triton"]
    verified_on_a_probe_step = True

    @classmethod
    def unavailable(cls, device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype) -> str:
        # Not the traits' device check: the interpreter runs it on CPU, which the traits leave out
        # because no host serves that way.
        if not triton_attention.available(device):
            return "Triton is not installed, or the device is neither CUDA nor a CPU under TRITON_INTERPRET=1"
        return ""

    @classmethod
    def forward(cls, call: AttentionCall) -> torch.Tensor:
        return triton_attention.paged_attention(
            call.q,
            *call.paged_cache(),
            call.meta.max_query_len,
            call.scale,
            call.k_scale,
            call.v_scale,
            window=call.window,
        )
