"""Elementwise steps of a decoder layer fused into one pass each on CPU (the C++ of ``cpu_kernel``).

Torch runs RMSNorm as five kernels, SwiGLU as three and rotary embedding as six, each reading and
writing the whole activation: at a 2048-token prefill chunk that is hundreds of MB of memory
traffic per layer. The fused kernels compute the same expressions in the same order, rounding to
the activations' dtype where torch's separate ops would, in one pass. On CUDA the same steps run as
the Triton kernels of ``triton_fused`` (where Triton is installed). Elsewhere (a CPU where no
prebuilt variant of the kernels loads, or CUDA without Triton) each function runs the plain torch
expression. The rotary embedding fused with the KV cache write is the attention backend's
(``ops.attention``): where it writes depends on the backend's cache layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from frontier_runtime.ops import cpu_kernel, triton_fused


def _fused(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and cpu_kernel.load()


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight * norm(r), r)`` with ``r = residual + x`` (or ``x`` without a residual).

    The sum is the stream the next layer adds to; with a residual given, it is written into
    ``residual`` in place (the caller hands over its buffer)."""
    dense = x.is_contiguous() and (residual is None or residual.is_contiguous())
    if triton_fused.applies(x) and dense and weight.dtype == x.dtype:
        return triton_fused.rms_norm(x, weight, eps, residual)
    if _fused(x) and x.is_contiguous() and weight.dtype == x.dtype:
        out = torch.empty_like(x)
        torch.ops.frontier.rms_norm(out, x, residual, weight, eps)
        return out, (x if residual is None else residual)
    summed = x if residual is None else residual.add_(x)
    h = summed.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype), summed


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [gate | up]`` along the last dimension."""
    inter = gate_up.shape[-1] // 2
    if triton_fused.applies(gate_up) and gate_up.is_contiguous():
        return triton_fused.silu_and_mul(gate_up)
    if _fused(gate_up) and gate_up.is_contiguous():
        out = gate_up.new_empty((*gate_up.shape[:-1], inter))
        torch.ops.frontier.silu_and_mul(out, gate_up)
        return out
    gate, up = gate_up.split(inter, dim=-1)
    return F.silu(gate) * up


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of q and k ([tokens, heads, head_dim]) at ``positions`` (torch path)."""
    c = cos[positions].to(q.dtype).unsqueeze(1)
    s = sin[positions].to(q.dtype).unsqueeze(1)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s
