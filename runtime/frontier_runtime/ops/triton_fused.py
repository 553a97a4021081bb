"""The elementwise steps of a decoder layer as one Triton kernel each, for CUDA tensors.

Torch runs RMSNorm as five kernels, SwiGLU as three, rotary embedding as six and the KV cache write as
four or more; in a decode step each is a ~1.5 µs launch over a few KB, so together they cost more GPU
time than the GEMMs. Each kernel here computes the torch expression of ``fused`` in one pass, rounding
to the activations' dtype exactly where torch's separate ops round (round to nearest even), with the
same float32 library functions CUDA's torch calls (libdevice's ``expf`` and ``rsqrtf``, IEEE
division), so the results equal torch's bit for bit except where a float32 sum is added up in another
order (RMSNorm's mean square: a few float32 ulps, at most one once rounded to bfloat16). The compiler
is told not to fuse a multiply and an add into an FMA, which would round once where torch rounds twice.

Grids come from tensor shapes only and every index is read on the device: nothing syncs with the
host, so a decode step using them can be captured in a CUDA graph.

Under ``TRITON_INTERPRET=1`` (tests on CPU) the same kernels run on CPU tensors, except that the
interpreter has no libdevice (numpy's ``exp`` and ``1 / sqrt`` stand in) and its float32 -> bfloat16
and float32 -> fp8 casts do not round to nearest even (the first truncates, the second loses the carry
into the exponent): there the rounding is done on the bits instead, to the same result the GPU's
``cvt.rn`` gives. ``force_on_cpu`` lets a test send a whole model's forward through them.
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace

import torch

from frontier_runtime.ops import triton_attention

FP8 = torch.float8_e4m3fn

_forced_on_cpu = False


def force_on_cpu(on: bool) -> None:
    """Send CPU tensors to these kernels too (tests, under Triton's interpreter); process-wide."""
    global _forced_on_cpu
    _forced_on_cpu = on


def available(device: torch.device | str | None = None) -> bool:
    """Whether the kernels can run on ``device``: where the Triton attention kernel can."""
    return triton_attention.available(device)


@functools.cache
def _available_on(kind: str) -> bool:
    # Triton reads TRITON_INTERPRET once, on first import: the answer cannot change in a process.
    return available(kind)


def applies(x: torch.Tensor) -> bool:
    """Whether ``fused`` hands ``x`` to these kernels: a CUDA tensor, or a CPU one while forced on."""
    kind = x.device.type
    return (kind == "cuda" or (kind == "cpu" and _forced_on_cpu)) and _available_on(kind)


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _kernels() -> SimpleNamespace:
    """The kernels, defined on first use (Triton reads TRITON_INTERPRET when a kernel is defined).

    Triton's interpreter runs a kernel with its module's globals and no closure, so the helpers the
    kernels call, and the modules they name, are bound as this module's globals here."""
    global tl, libdevice, to_dtype, to_e4m3_bits, rotate, store_cache
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    @triton.jit
    def to_dtype(x, dtype: tl.constexpr, BY_BITS: tl.constexpr):
        """float32 ``x`` rounded to nearest even in ``dtype`` (float32, bfloat16 or float16)."""
        if BY_BITS and dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = bits + 0x7FFF + ((bits >> 16) & 1)
            return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            return x.to(dtype)

    @triton.jit
    def to_e4m3_bits(y, BY_BITS: tl.constexpr):
        """float32 ``y`` (|y| <= 448) as the byte of the nearest float8 e4m3fn, ties to even."""
        if BY_BITS:
            sign = (y.to(tl.uint32, bitcast=True) >> 24) & 0x80
            a = tl.abs(y)
            # Normal (|y| >= 2^-6): the 23-bit mantissa rounded to 3 bits on the integer bits, where
            # a carry moves into the exponent; then the exponent rebiased from 127 to 7.
            bits = a.to(tl.uint32, bitcast=True)
            bits = bits + 0x7FFFF + ((bits >> 20) & 1)
            normal = (bits >> 20) - (120 << 3)
            # Subnormal: multiples of 2^-9, and adding 2^23 rounds a float32 below 8 to an integer.
            steps = (a * 512.0 + 8388608.0) - 8388608.0
            code = tl.where(a >= 0.015625, normal, steps.to(tl.uint32))
            return (code | sign).to(tl.uint8)
        else:
            return y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)

    @triton.jit
    def rms_norm_kernel(
        out_ptr,
        x_ptr,
        res_ptr,
        w_ptr,
        stride_out,
        stride_x,
        stride_res,
        hidden,
        inv_hidden,
        eps,
        HAS_RESIDUAL: tl.constexpr,
        BLOCK: tl.constexpr,
        BY_BITS: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < hidden
        dtype = x_ptr.dtype.element_ty
        h = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * stride_res + cols, mask=ok, other=0.0).to(tl.float32)
            summed = to_dtype(r + h, dtype, BY_BITS)
            tl.store(res_ptr + row * stride_res + cols, summed, mask=ok)
            h = summed.to(tl.float32)
        # CUDA's torch takes the mean as sum * (1 / n), in float32.
        mean_sq = tl.sum(h * h, axis=0) * inv_hidden
        if BY_BITS:
            inv_rms = tl.rsqrt(mean_sq + eps)
        else:
            inv_rms = libdevice.rsqrt(mean_sq + eps)
        normed = to_dtype(h * inv_rms, dtype, BY_BITS).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_out + cols, to_dtype(w * normed, dtype, BY_BITS), mask=ok)

    @triton.jit
    def silu_and_mul_kernel(
        out_ptr,
        gate_up_ptr,
        stride_out,
        stride_gate_up,
        inter,
        BLOCK: tl.constexpr,
        BY_BITS: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < inter
        dtype = gate_up_ptr.dtype.element_ty
        gate_row = gate_up_ptr + row * stride_gate_up
        g = tl.load(gate_row + cols, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(gate_row + inter + cols, mask=ok, other=0.0).to(tl.float32)
        if BY_BITS:
            e = tl.exp(-g)
        else:
            e = libdevice.exp(-g)
        # F.silu rounds its output to the input dtype before the multiply does.
        act = to_dtype(tl.math.div_rn(g, 1.0 + e), dtype, BY_BITS).to(tl.float32)
        tl.store(out_ptr + row * stride_out + cols, to_dtype(act * u, dtype, BY_BITS), mask=ok)

    @triton.jit
    def rotate(x1, x2, c1, c2, s1, s2, dtype: tl.constexpr, BY_BITS: tl.constexpr):
        """``x * cos + rotate_half(x) * sin`` for the halves (x1, x2), each product and the sum
        rounded to ``dtype`` as torch's three ops round them."""
        a = to_dtype(x1 * c1, dtype, BY_BITS).to(tl.float32)
        b = to_dtype(-x2 * s1, dtype, BY_BITS).to(tl.float32)
        c = to_dtype(x2 * c2, dtype, BY_BITS).to(tl.float32)
        d = to_dtype(x1 * s2, dtype, BY_BITS).to(tl.float32)
        return to_dtype(a + b, dtype, BY_BITS), to_dtype(c + d, dtype, BY_BITS)

    @triton.jit
    def store_cache(ptrs, x, inv_scale, mask, TO_FP8: tl.constexpr, BY_BITS: tl.constexpr):
        """``x`` into the cache: as it is, or as fp8 bytes of x / scale clamped to e4m3's range."""
        if TO_FP8:
            # x * (1 / scale): CUDA's torch divides by a scalar so (the reciprocal in float32).
            y = x.to(tl.float32) * inv_scale
            y = tl.clamp(y, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
            tl.store(ptrs, to_e4m3_bits(y, BY_BITS), mask=mask)
        else:
            tl.store(ptrs, x, mask=mask)

    @triton.jit
    def rotary_kv_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        positions_ptr,
        cos_ptr,
        sin_ptr,
        k_cache_ptr,
        v_cache_ptr,
        slots_ptr,
        stride_qt,
        stride_qh,
        stride_qd,
        stride_kt,
        stride_kh,
        stride_kd,
        stride_vt,
        stride_vh,
        stride_vd,
        stride_cos,
        stride_sin,
        stride_kcs,
        stride_kch,
        stride_kcd,
        stride_vcs,
        stride_vch,
        stride_vcd,
        k_inv_scale,
        v_inv_scale,
        HEADS: tl.constexpr,
        KV_HEADS: tl.constexpr,
        HALF: tl.constexpr,
        BLOCK_HEADS: tl.constexpr,
        BLOCK_KV: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        FP8_CACHE: tl.constexpr,
        BY_BITS: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        dtype = q_ptr.dtype.element_ty
        pos = tl.load(positions_ptr + t).to(tl.int64)
        slot = tl.load(slots_ptr + t).to(tl.int64)
        d = tl.arange(0, BLOCK_HALF)
        d_ok = d < HALF
        # The tables' rows rounded to the activations' dtype first, as ``cos[positions].to(dtype)``.
        cos_row = cos_ptr + pos * stride_cos
        sin_row = sin_ptr + pos * stride_sin
        c1 = to_dtype(tl.load(cos_row + d, mask=d_ok, other=0.0), dtype, BY_BITS).to(tl.float32)
        c2 = to_dtype(tl.load(cos_row + HALF + d, mask=d_ok, other=0.0), dtype, BY_BITS).to(tl.float32)
        s1 = to_dtype(tl.load(sin_row + d, mask=d_ok, other=0.0), dtype, BY_BITS).to(tl.float32)
        s2 = to_dtype(tl.load(sin_row + HALF + d, mask=d_ok, other=0.0), dtype, BY_BITS).to(tl.float32)
        c1, c2, s1, s2 = c1[None, :], c2[None, :], s1[None, :], s2[None, :]

        # q, rotated where it lies (it may be a view into the fused qkv projection: strides).
        h = tl.arange(0, BLOCK_HEADS)
        ok = (h < HEADS)[:, None] & d_ok[None, :]
        q_lo = q_ptr + t * stride_qt + h[:, None] * stride_qh + d[None, :] * stride_qd
        q_hi = q_lo + HALF * stride_qd
        x1 = tl.load(q_lo, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(q_hi, mask=ok, other=0.0).to(tl.float32)
        o1, o2 = rotate(x1, x2, c1, c2, s1, s2, dtype, BY_BITS)
        tl.store(q_lo, o1, mask=ok)
        tl.store(q_hi, o2, mask=ok)

        # k, rotated into its cache slot; v copied beside it.
        h = tl.arange(0, BLOCK_KV)
        ok = (h < KV_HEADS)[:, None] & d_ok[None, :]
        k_lo = k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :] * stride_kd
        x1 = tl.load(k_lo, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(k_lo + HALF * stride_kd, mask=ok, other=0.0).to(tl.float32)
        o1, o2 = rotate(x1, x2, c1, c2, s1, s2, dtype, BY_BITS)
        kc_lo = k_cache_ptr + slot * stride_kcs + h[:, None] * stride_kch + d[None, :] * stride_kcd
        store_cache(kc_lo, o1, k_inv_scale, ok, FP8_CACHE, BY_BITS)
        store_cache(kc_lo + HALF * stride_kcd, o2, k_inv_scale, ok, FP8_CACHE, BY_BITS)

        v_lo = v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :] * stride_vd
        vc_lo = v_cache_ptr + slot * stride_vcs + h[:, None] * stride_vch + d[None, :] * stride_vcd
        for part in tl.static_range(2):
            v = tl.load(v_lo + part * HALF * stride_vd, mask=ok, other=0.0)
            store_cache(vc_lo + part * HALF * stride_vcd, v, v_inv_scale, ok, FP8_CACHE, BY_BITS)

    @triton.jit
    def weight_only_gemm_kernel(
        out_ptr,
        x_ptr,
        w_ptr,
        scale_ptr,
        bias_ptr,
        rows,
        outs,
        ins,
        stride_out,
        stride_x,
        stride_w,
        HAS_BIAS: tl.constexpr,
        FP8_WEIGHT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BY_BITS: tl.constexpr,
    ):
        dtype = out_ptr.dtype.element_ty
        m = tl.arange(0, BLOCK_M)
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        k = tl.arange(0, BLOCK_K)
        m_ok, n_ok = m < rows, n < outs
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(0, ins, BLOCK_K):
            kk = start + k
            k_ok = kk < ins
            x = tl.load(
                x_ptr + m[:, None] * stride_x + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0
            )
            # The weight tile [BLOCK_K, BLOCK_N] in its stored bytes (an fp8 weight comes as uint8: a
            # masked lane reads 0, never a NaN pattern), widened in registers: int8 and e4m3 values
            # are exact in bfloat16, float16 and float32.
            w = tl.load(
                w_ptr + n[None, :] * stride_w + kk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0
            )
            if FP8_WEIGHT:
                w = w.to(tl.float8e4nv, bitcast=True)
            if BY_BITS or dtype == tl.float32:
                # The interpreter's numpy has no bfloat16; products of two 16-bit floats are exact in
                # float32, so this is the tensor cores' product.
                acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(x, w.to(dtype))
        # Rounded where ``QuantizationMethod.linear``'s torch expression rounds: the product in the
        # activations' dtype, then scaled per output channel in float32, then the bias added.
        product = to_dtype(acc, dtype, BY_BITS).to(tl.float32)
        scale = tl.load(scale_ptr + n, mask=n_ok, other=0.0)
        out = to_dtype(product * scale[None, :], dtype, BY_BITS)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
            out = to_dtype(out.to(tl.float32) + bias[None, :], dtype, BY_BITS)
        tl.store(out_ptr + m[:, None] * stride_out + n[None, :], out, mask=m_ok[:, None] & n_ok[None, :])

    return SimpleNamespace(
        rms_norm=rms_norm_kernel,
        silu_and_mul=silu_and_mul_kernel,
        rotary_kv=rotary_kv_kernel,
        weight_only_gemm=weight_only_gemm_kernel,
    )


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@functools.cache
def _float32_reciprocal(x: float) -> float:
    """``1 / x`` as CUDA's torch computes a division by a scalar: float32 over float32."""
    return (torch.ones((), dtype=torch.float32) / torch.tensor(x, dtype=torch.float32)).item()


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight * norm(r), r)`` with ``r = residual + x`` written into ``residual`` (or ``r = x``).

    ``x``, ``residual`` and ``weight`` contiguous, of one dtype."""
    hidden = x.shape[-1]
    out = torch.empty_like(x)
    rows = x.numel() // hidden if hidden else 0
    if rows:
        x2, out2 = x.view(rows, hidden), out.view(rows, hidden)
        res2 = x2 if residual is None else residual.view(rows, hidden)
        block = _next_pow2(hidden)
        _kernels().rms_norm[(rows,)](
            out2,
            x2,
            res2,
            weight,
            out2.stride(0),
            x2.stride(0),
            res2.stride(0),
            hidden,
            _float32_reciprocal(float(hidden)),
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            BY_BITS=_interpreted(),
            num_warps=min(max(block // 256, 1), 8),
            enable_fp_fusion=False,
        )
    return out, (x if residual is None else residual)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for a contiguous ``gate_up = [gate | up]`` along the last dimension."""
    inter = gate_up.shape[-1] // 2
    out = gate_up.new_empty((*gate_up.shape[:-1], inter))
    rows = out.numel() // inter if inter else 0
    if rows:
        gu2, out2 = gate_up.view(rows, 2 * inter), out.view(rows, inter)
        block = min(1024, _next_pow2(inter))
        grid = (rows, -(-inter // block))
        _kernels().silu_and_mul[grid](
            out2,
            gu2,
            out2.stride(0),
            gu2.stride(0),
            inter,
            BLOCK=block,
            BY_BITS=_interpreted(),
            num_warps=4,
            enable_fp_fusion=False,
        )
    return out


# A decode step's rows: at most this many, one tile of rows covers them all and each weight tile is
# read from memory once. Past it (prefill) torch's GEMM, which reuses each weight tile across rows.
WEIGHT_ONLY_ROWS = 16
# Tile sizes chosen on paper (32 output channels a program, so a 4096-wide projection fills 128 SMs;
# 128 bytes of int8 weight a row per step): `bench/quantized_weights.py --gpu-engine` measures them.
_WO_BLOCK_N, _WO_BLOCK_K = 32, 128


def weight_only_applies(x: torch.Tensor, qweight: torch.Tensor) -> bool:
    """Whether ``weight_only_linear`` takes ``x`` times ``qweight``: the kernels apply, a decode
    step's few rows, and a GPU whose Triton multiplies these types: bf16 products need sm80+, and
    e4m3 (``float8e4nv``) exists in Triton from sm89 (an A100's fp8 weights stay dequantized)."""
    if not applies(x) or x.numel() > WEIGHT_ONLY_ROWS * x.shape[-1]:
        return False
    if not x.is_cuda:
        return True  # forced on CPU tensors, under the interpreter
    needs = (8, 9) if qweight.dtype == FP8 else (8, 0)
    return torch.cuda.get_device_capability(x.device) >= needs


def weight_only_linear(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ (qweight * scale).T + bias`` for int8 or float8_e4m3fn ``qweight`` [out, in] with one
    float32 ``scale`` per output channel, in x's dtype, as ``QuantizationMethod.linear`` computes it
    but without a dequantized copy of the weight: each weight tile is widened in registers, so a
    decode step streams the weight's own bytes once (half of bf16's for int8 and fp8).

    At most ``WEIGHT_ONLY_ROWS`` rows of ``x``; its last dimension contiguous."""
    ins, outs = x.shape[-1], qweight.shape[0]
    rows = x.numel() // ins if ins else 0
    assert rows <= WEIGHT_ONLY_ROWS, f"{rows} rows: weight_only_linear takes at most {WEIGHT_ONLY_ROWS}"
    x2 = x.reshape(rows, ins)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = x.new_empty((rows, outs))
    fp8 = qweight.dtype == FP8
    if rows and outs:
        _kernels().weight_only_gemm[(-(-outs // _WO_BLOCK_N),)](
            out,
            x2,
            qweight.view(torch.uint8) if fp8 else qweight,
            scale,
            out if bias is None else bias,
            rows,
            outs,
            ins,
            out.stride(0),
            x2.stride(0),
            qweight.stride(0),
            HAS_BIAS=bias is not None,
            FP8_WEIGHT=fp8,
            BLOCK_M=WEIGHT_ONLY_ROWS,
            BLOCK_N=_WO_BLOCK_N,
            BLOCK_K=_WO_BLOCK_K,
            BY_BITS=_interpreted(),
            num_warps=4,
            enable_fp_fusion=False,
        )
    return out.view(*x.shape[:-1], outs)


def rotary_and_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Rotate q in place and write rotated k and v at ``slots`` of a flash-layout cache, one kernel.

    q, k, v: [tokens, heads, head_dim], any strides; cos, sin: [positions, head_dim] float32 with
    dense rows (neox halves); the caches ``[num_blocks, block_size, kv_heads, head_dim]`` (contiguous), of q's dtype
    or fp8 e4m3, which holds value / scale clamped to ±448."""
    tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    if tokens == 0:
        return
    fp8 = k_cache.dtype == FP8
    if fp8:
        # Written as bytes: the same store on every Triton backend (and the interpreter).
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    kc = k_cache.view(-1, kv_heads, head_dim)
    vc = v_cache.view(-1, kv_heads, head_dim)
    half = head_dim // 2
    block = _next_pow2(heads) * _next_pow2(half)
    _kernels().rotary_kv[(tokens,)](
        q,
        k,
        v,
        positions.contiguous(),
        cos,
        sin,
        kc,
        vc,
        slots.contiguous(),
        *q.stride(),
        *k.stride(),
        *v.stride(),
        cos.stride(0),
        sin.stride(0),
        *kc.stride(),
        *vc.stride(),
        _float32_reciprocal(float(k_scale)) if fp8 else 1.0,
        _float32_reciprocal(float(v_scale)) if fp8 else 1.0,
        HEADS=heads,
        KV_HEADS=kv_heads,
        HALF=half,
        BLOCK_HEADS=_next_pow2(heads),
        BLOCK_KV=_next_pow2(kv_heads),
        BLOCK_HALF=_next_pow2(half),
        FP8_CACHE=fp8,
        BY_BITS=_interpreted(),
        num_warps=min(max(block // 512, 1), 8),
        enable_fp_fusion=False,
    )
