"""The decoder's building blocks besides attention: linear, RMSNorm, rotary tables, SwiGLU MLP."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from frontier_runtime.distributed import TPGroup
from frontier_runtime.models.llama import quant
from frontier_runtime.models.llama.config import LlamaConfig
from frontier_runtime.ops import fused, panel_gemm

# The batch size oneDNN lays a packed weight out for. The layout serves every batch size (rows of
# the output do not depend on how many there are); 32 is the middle of a decode step's range.
PACK_HINT_ROWS = 32


class Linear(nn.Linear):
    """``nn.Linear`` that, on CPU, multiplies by a weight laid out once for the CPU's GEMM.

    A float32 CPU weight is packed once, at load: into the panels of Frontier's own GEMM
    (:mod:`frontier_runtime.ops.panel_gemm`) where the CPU has AVX-512, else into oneDNN's
    blocked layout. Measured on the 100M model's shapes with the weights streaming from memory
    (two threads): the panel GEMM is 5-46 % faster than oneDNN's at the 1-128 rows of decode steps
    and 2-10 % slower at 512-2048 rows; oneDNN's is itself 10-30 % faster than MKL's GEMM
    at 8-256 rows. Where neither is available the weight stays [in, out] and ``torch.matmul``
    multiplies by it (MKL is 10-35 % faster in that layout than with [out, in] at 16-256 rows).

    A bfloat16 weight on a CPU with AVX512-BF16 (the ``avx512bf16`` kernels) stays bf16, packed into
    the pair panels of the bf16 panel GEMM (:func:`~frontier_runtime.ops.panel_gemm.linear_bf16`):
    half the bytes of a widened copy (2-3x its speed), 1.3-3x oneDNN's bf16 GEMM on the plain
    weight (what such a layer ran before) at the 1-128 rows of decode steps and level with or
    ahead of oneDNN on a packed weight (the 100M model's shapes, two threads:
    ``bench/panel_gemm_vs_onednn.py --dtype bfloat16``), and a row's result never depends on its
    batch. The LM head leaves its float32 sums unrounded (``float_out``).
    A bfloat16/float16 weight on a CPU without native 16-bit GEMM (no AVX512-BF16/AMX: see
    :func:`native_half_gemm`) is kept as a float32 copy instead: torch's emulated bf16 GEMM is ~6x
    slower than fp32 here. The products are those of a bf16 GEMM with fp32 accumulation (both
    operands widen exactly) and the output is rounded back to the activation dtype, at twice the
    weight memory.

    A quantized layer (``model.quantization``, :mod:`~frontier_runtime.models.llama.quant`) holds
    ``qweight`` (int8 or float8_e4m3fn) and ``weight_scale`` (float32, one per output channel) as
    buffers instead of a weight; on a CPU with the panel GEMM an int8 ``qweight`` is packed into its
    panels [ceil(out / 32), in, 32] and widened inside the kernel.
    """

    weight_t: torch.Tensor | None = None
    packed: torch.Tensor | None = None  # the weight packed for a CPU GEMM (float32, or bf16 pairs)
    panels: bool = False  # packed for the panel GEMM (else for oneDNN)
    bf16_panels: bool = False  # packed for the bf16 panel GEMM
    float_out: bool = False  # a bf16 GEMM may leave its sums in float32 (the LM head: logits)
    widen: bool = False  # the CPU weight is a float32 copy of a 16-bit weight
    qweight: torch.Tensor | None  # quantized weight (a buffer), [out, in] or int8 panels
    weight_scale: torch.Tensor | None  # its float32 scale per output channel (a buffer)
    qpanels: bool = False  # qweight is packed for the panel GEMM
    quantization: type[quant.QuantizationMethod] = quant.Unquantized  # multiplies by qweight

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias)
        # Buffers, so that the quantized weight moves, counts and prints with the module.
        self.register_buffer("qweight", None)
        self.register_buffer("weight_scale", None)

    @staticmethod
    def transposed_dtype(dtype: torch.dtype) -> torch.dtype | None:
        """The dtype of the [in, out] copy a CPU layer multiplies by; None to keep [out, in]."""
        half = dtype in (torch.bfloat16, torch.float16)
        if half and native_half_gemm():
            return None  # oneDNN's bf16 path wants the [out, in] layout F.linear passes it
        return torch.float32 if half else dtype

    @staticmethod
    def packs(dtype: torch.dtype) -> bool:
        """Whether a CPU layer of a ``dtype`` model multiplies by a packed weight: float32, or bf16
        for the bf16 panel GEMM."""
        if dtype == torch.bfloat16 and panel_gemm.bf16_available():
            return True
        return Linear.transposed_dtype(dtype) == torch.float32 and (
            panel_gemm.available() or onednn_packing()
        )

    def adopt_packed(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        """Pack ``weight`` ([out, in] float32, or bfloat16 where :meth:`packs` says so; contiguous,
        filled by the loader) for a ``dtype`` model.

        The packings read a contiguous [out, in] weight straight into their layout; from a
        transposed view they would first make a contiguous copy (a second transient copy)."""
        if weight.dtype == torch.bfloat16 and weight.shape[1] % 2:
            # The bf16 panels pair K steps: an odd K stays [out, in] for oneDNN's bf16 GEMM.
            self.weight = nn.Parameter(weight, requires_grad=False)
            return
        self.widen = dtype != weight.dtype
        if weight.dtype != torch.float32 and self.bias is not None:  # the kernels add float32 biases
            self.bias = nn.Parameter(self.bias.detach().float(), requires_grad=False)
        self._pack(weight)
        self.weight = None

    def _pack(self, weight: torch.Tensor) -> None:
        """Hold ``weight`` ([out, in] float32 or bf16, contiguous) packed for the panel GEMM, else oneDNN."""
        self.bf16_panels = weight.dtype == torch.bfloat16
        self.panels = self.bf16_panels or panel_gemm.available()
        if self.bf16_panels:
            self.packed = panel_gemm.pack_bf16(weight)
        elif self.panels:
            self.packed = panel_gemm.pack(weight)
        else:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_HINT_ROWS)

    def adopt_panels(self, panels: torch.Tensor) -> None:
        """Take float32 ``panels`` ([out / 32, in, 32], filled by the loader straight from the
        checkpoint) as the weight of a float32 model: what :meth:`adopt_packed` would pack."""
        self.widen = self.bf16_panels = False
        self.panels = True
        self.packed = panels
        self.weight = None

    def adopt_quantized(
        self, qweight: torch.Tensor, scale: torch.Tensor, method: type[quant.QuantizationMethod]
    ) -> None:
        """Take ``qweight`` ([out, in], filled by the loader) and its per-channel ``scale`` as the weight."""
        self.quantization = method
        self.qpanels = method.uses_panels(qweight.device)
        self.register_buffer("qweight", panel_gemm.pack(qweight) if self.qpanels else qweight.contiguous())
        self.register_buffer("weight_scale", scale.float().contiguous())
        self.weight = None

    def adopt_transposed(self, weight_t: torch.Tensor, dtype: torch.dtype) -> None:
        """Take ``weight_t`` ([in, out], filled by the loader) as the weight of a ``dtype`` model."""
        self.widen = weight_t.dtype != dtype
        self.weight_t = weight_t
        self.weight = None  # one copy only
        if self.widen and self.bias is not None:
            self.bias = nn.Parameter(self.bias.detach().float(), requires_grad=False)

    def use_transposed_weight(self) -> None:
        """Swap a loaded [out, in] weight for the CPU layout (a copy, then the original is freed)."""
        if self.weight_t is not None or self.packed is not None or self.qweight is not None:
            return
        weight = self.weight.detach()
        layout = self.transposed_dtype(weight.dtype)
        if layout is None:
            return
        self.adopt_transposed(weight.to(layout).t().contiguous(), weight.dtype)

    def pack(self) -> None:
        """Pack a float32 [in, out] weight, or a bf16 [out, in] one where the CPU has the bf16 panel
        GEMM, for the CPU's GEMM (no-op where none packs)."""
        weight = self.weight
        if (
            self.weight_t is None
            and self.packed is None
            and self.qweight is None
            and weight is not None
            and weight.dtype == torch.bfloat16
            and self.packs(torch.bfloat16)
        ):
            self.adopt_packed(weight.detach().contiguous(), torch.bfloat16)
            return
        if self.weight_t is None or self.weight_t.dtype != torch.float32 or not self.packs(torch.float32):
            return
        self._pack(self.weight_t.t().contiguous())
        self.weight_t = None

    def dense_weight(self) -> torch.Tensor:
        """The weight as [out, in], whichever form the layer holds (a copy when packed or quantized)."""
        if self.qweight is not None and self.weight_scale is not None:
            q = panel_gemm.unpack(self.qweight, self.out_features) if self.qpanels else self.qweight
            return quant.dequantize(q, self.weight_scale, torch.float32)
        if self.packed is not None:
            if self.bf16_panels:
                return panel_gemm.unpack_bf16(self.packed, self.out_features)
            return (
                panel_gemm.unpack(self.packed, self.out_features) if self.panels else self.packed.to_dense()
            )
        return self.weight if self.weight_t is None else self.weight_t.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.qweight is not None and self.weight_scale is not None:
            return self.quantization.linear(x, self.qweight, self.weight_scale, self.bias, self.qpanels)
        if self.packed is not None and self.bf16_panels:
            out_dtype = torch.float32 if self.float_out else torch.bfloat16
            out = panel_gemm.linear_bf16(x.bfloat16(), self.packed, self.out_features, self.bias, out_dtype)
            return out if self.float_out or x.dtype == torch.bfloat16 else out.to(x.dtype)
        if self.packed is not None:
            x32 = x.float() if self.widen else x
            if self.panels:
                out = panel_gemm.linear(x32, self.packed, self.out_features, self.bias)
            else:
                out = torch.ops.mkldnn._linear_pointwise(x32, self.packed, self.bias, "none", [], "")
            return out.to(x.dtype) if self.widen else out
        if self.weight_t is None:
            return F.linear(x, self.weight, self.bias)
        if self.widen:
            out = torch.matmul(x.float(), self.weight_t)
            out = out if self.bias is None else out + self.bias
            return out.to(x.dtype)
        out = torch.matmul(x, self.weight_t)
        return out if self.bias is None else out + self.bias


@functools.cache
def onednn_packing() -> bool:
    """Whether this torch can pack a linear weight for oneDNN (and multiply by it correctly)."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    try:
        w = torch.arange(12, dtype=torch.float32).view(3, 4) / 8
        x = torch.arange(8, dtype=torch.float32).view(2, 4) / 8
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT_ROWS)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return bool(torch.allclose(got, x @ w.t()))
    except (RuntimeError, AttributeError):
        return False


# CPU flags (as /proc/cpuinfo spells them) of instructions that multiply 16-bit floats natively.
NATIVE_HALF_FLAGS = {"avx512_bf16", "amx_bf16", "amx_fp16", "avx512_fp16", "avx_ne_convert"}


@functools.cache
def native_half_gemm() -> bool:
    """Whether this CPU multiplies bf16/fp16 natively (AVX512-BF16, AMX, AVX512-FP16, AVX-NE-CONVERT).

    Not oneDNN's ``_is_mkldnn_bf16_supported()``: that is true on any AVX-512 CPU, where oneDNN
    emulates bf16 and its GEMM runs ~3.6x slower than fp32 (measured here: AVX-512 without BF16).
    """
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported")
    try:
        if any(getattr(torch.cpu, probe)() for probe in probes if hasattr(torch.cpu, probe)):
            return True
    except RuntimeError:
        pass
    return bool(cpu_flags() & NATIVE_HALF_FLAGS)


def cpu_flags() -> set[str]:
    """The flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(residual + x), residual + x)``; the sum is written into ``residual`` in place."""
        return fused.rms_norm(x, self.weight, self.eps, residual)


# A CPU MLP runs a long prefill chunk this many bytes of gate/up output at a time. Larger blocks
# come from fresh mmap()ed memory on every call (glibc hands out allocations over 32 MB that way
# and unmaps them when freed), and first-touch page faults then cost ~15 % of the gate/up GEMM at
# 2048 rows; blocks this size are reused from the heap. The rows' results do not change.
MLP_BLOCK_BYTES = 16 << 20


class MLP(nn.Module):
    """SwiGLU. Gate and up fused into one column-parallel matmul; down is row-parallel."""

    def __init__(self, cfg: LlamaConfig, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.inter = cfg.intermediate_size // tp.world_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * self.inter, bias=cfg.mlp_bias)
        # The bias is added once, on rank 0, before the all-reduce.
        self.down_proj = Linear(self.inter, cfg.hidden_size, bias=cfg.mlp_bias and tp.rank == 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.block_rows(x)
        if x.shape[0] <= rows:
            return self.tp.all_reduce(self._swiglu(x))
        return self.tp.all_reduce(torch.cat([self._swiglu(block) for block in x.split(rows)]))

    def _swiglu(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(fused.silu_and_mul(self.gate_up_proj(x)))

    def block_rows(self, x: torch.Tensor) -> int:
        """Rows of ``x`` one pass takes: all of them off CPU, else ``MLP_BLOCK_BYTES`` of gate/up."""
        if x.device.type != "cpu":
            return x.shape[0]
        row_bytes = 2 * self.inter * 4  # float32 on the packed paths
        return max(64, MLP_BLOCK_BYTES // row_bytes // 64 * 64)


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    # llama3: long wavelengths are divided by `factor`, short ones kept, the middle band interpolated.
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(cfg: LlamaConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for every position, [max_position_embeddings, head_dim], float32."""
    inv_freq = rope_inv_freq(cfg)
    t = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device), emb.sin().to(device)
