"""Linear layers on CPU through the C++ panel GEMM of ``cpu_kernel``: float32 or int8 weights.

A weight [N, K] is packed once, at load, into panels of 32 output columns ([P, K, 32], the last
panel padded with zeros), the layout the kernel's 8 x 32 register tile reads with two vector
loads per K step. The kernel keeps a K block of a panel in L1 for every row tile of the step and
prefetches the weights ahead while it computes, spread evenly over the tiles' K steps, which is
what decode steps need: few rows, the whole weight streaming from memory once per step. Measured
against oneDNN's packed GEMM on the 100M model's shapes (``bench/panel_gemm_vs_onednn.py
--threads 2``: weights streaming from memory, best GFLOPS of 5 alternating pairs, ratio the
median of the pairs):

    rows           1    4    8   16   32   48   64  128  512  2048
    panel  GFLOPS 14   57  104  179  279  286  307  311  315   265
    oneDNN GFLOPS 13   47   82  136  189  224  251  290  323   293
    ratio       1.05 1.19 1.26 1.32 1.46 1.27 1.22 1.08 0.98  0.90

Int8 weights (weight-only quantization, a float32 scale per output column) are packed into the
same panels, a quarter of the bytes, and widened to float32 inside the kernel: a decode step, which
streams every weight once, reads 4x fewer bytes (``bench/quantized_weights.py``).

Bfloat16 weights, where the CPU has AVX512-BF16 (the ``avx512bf16`` variant, ``bf16_available()``),
stay bf16: packed by pairs of K steps into [ceil(N / 32), K / 2, 32, 2], multiplied by bf16
activations with the CPU's bf16 dot product (float32 sums, one rounding to bf16 at the end).
Measured on the same shapes with 2 threads on such a CPU (``bench/panel_gemm_vs_onednn.py --dtype
bfloat16``, best GFLOPS of 7 on a shared 2-core machine with avx512_bf16):

    rows            1    8   16   32   64  128  2048
    bf16 panel     28  116  300  714  847  888   248
    oneDNN packed  25   42  130  591  751  835   277
    oneDNN plain   21   42   89  347  526  670   260
    widened fp32   18   25  109  339  384  412    94

Each output is summed over k in order whatever the number of rows, so a sequence's logits do not
depend on the batch it shares a step with. Available where the ``avx512`` variant of the kernels
(or the ``avx512bf16`` one, which holds it too) is loaded (``available()``); elsewhere layers keep
oneDNN's packing.
"""

from __future__ import annotations

import functools

import torch

from frontier_runtime.ops import cpu_kernel

PANEL = 32  # output columns per panel


def available() -> bool:
    """Whether this CPU runs the panel GEMM (the kernels loaded and switched on, the avx512 variant)."""
    return cpu_kernel.load() and _built_with_avx512()


@functools.cache  # a property of the loaded library; the switch is read on every call above
def _built_with_avx512() -> bool:
    return bool(torch.ops.frontier.panel_gemm())


def bf16_available() -> bool:
    """Whether this CPU runs the bf16 panel GEMM (the kernels loaded and switched on, ``avx512bf16``)."""
    return cpu_kernel.load() and _built_with_bf16()


@functools.cache
def _built_with_bf16() -> bool:
    return bool(torch.ops.frontier.panel_gemm_bf16())


def pack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] (bfloat16, K even) as pair panels [ceil(N / 32), K / 2, 32, 2]."""
    n, k = weight.shape
    if k % 2:
        raise ValueError(f"the bf16 panel GEMM takes an even K, not {k}")
    panels = -(-n // PANEL)
    if n % PANEL:
        weight = torch.cat([weight, weight.new_zeros(panels * PANEL - n, k)])
    return weight.view(panels, PANEL, k // 2, 2).transpose(1, 2).contiguous()


def unpack_bf16(panels: torch.Tensor, n: int) -> torch.Tensor:
    """The [n, K] weight pair ``panels`` hold (a copy)."""
    p, half, _, _ = panels.shape
    return panels.transpose(1, 2).reshape(p * PANEL, 2 * half)[:n].contiguous()


def linear_bf16(
    x: torch.Tensor,
    panels: torch.Tensor,
    n: int,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``x @ W.T + bias`` for bfloat16 ``x`` [..., K], the pair-packed bf16 ``W`` of ``n`` rows and
    a float32 ``bias``; ``out_dtype`` out (bfloat16, or float32 for sums left unrounded)."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], n, dtype=out_dtype, device=x.device)
    torch.ops.frontier.panel_linear_bf16(out, rows, panels, bias)
    return out.view(*x.shape[:-1], n)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] (float32, or int8 for :func:`linear_int8`) as panels [ceil(N / 32), K, 32]."""
    n, k = weight.shape
    panels = -(-n // PANEL)
    if n % PANEL:
        weight = torch.cat([weight, weight.new_zeros(panels * PANEL - n, k)])
    return weight.view(panels, PANEL, k).transpose(1, 2).contiguous()


def unpack(panels: torch.Tensor, n: int) -> torch.Tensor:
    """The [n, K] weight ``panels`` hold (a copy)."""
    p, k, _ = panels.shape
    return panels.transpose(1, 2).reshape(p * PANEL, k)[:n].contiguous()


def linear(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` for float32 ``x`` [..., K] and the packed ``W`` of ``n`` rows."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], n, dtype=torch.float32, device=x.device)
    torch.ops.frontier.panel_linear(out, rows, panels, bias)
    return out.view(*x.shape[:-1], n)


def linear_int8(
    x: torch.Tensor, panels: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``(x @ Q.T) * scale + bias`` for float32 ``x`` [..., K], the packed int8 ``Q`` and its float32
    per-column ``scale`` [N]."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    n = scale.shape[0]
    out = torch.empty(rows.shape[0], n, dtype=torch.float32, device=x.device)
    torch.ops.frontier.panel_linear_int8(out, rows, panels, scale, bias)
    return out.view(*x.shape[:-1], n)
