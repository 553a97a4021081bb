"""The fused CPU kernels compute what the torch expressions they replace compute."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from engine_fixtures import assert_prebuilt_kernels_loaded, needs_native_kernels
from frontier_runtime.ops import fused
from frontier_runtime.ops.attention import AttentionMetadata, CpuKernelBackend, RotaryWrite

pytestmark = needs_native_kernels


@pytest.fixture(autouse=True)
def _kernels_loaded() -> None:
    assert_prebuilt_kernels_loaded()


DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_the_torch_expression(dtype: torch.dtype) -> None:
    x, w = torch.randn(37, 96).to(dtype), torch.randn(96).to(dtype)
    out, stream = fused.rms_norm(x, w, 1e-5)
    torch.testing.assert_close(out, _norm(x, w, 1e-5), **TOL[dtype])
    assert stream is x


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_adds_the_residual_in_place_first(dtype: torch.dtype) -> None:
    x, r, w = torch.randn(5, 64).to(dtype), torch.randn(5, 64).to(dtype), torch.randn(64).to(dtype)
    want_sum = r + x
    out, stream = fused.rms_norm(x, w, 1e-6, residual=r)
    assert stream is r and torch.equal(r, want_sum)
    torch.testing.assert_close(out, _norm(want_sum, w, 1e-6), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_the_torch_expression(dtype: torch.dtype) -> None:
    gate_up = (torch.randn(9, 2 * 80) * 4).to(dtype)  # large magnitudes: both tails of the sigmoid
    gate, up = gate_up.split(80, dim=-1)
    torch.testing.assert_close(fused.silu_and_mul(gate_up), F.silu(gate) * up, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_into_the_cache_matches_rotating_then_writing(dtype: torch.dtype) -> None:
    tokens, heads, kv_heads, hd, block = 6, 4, 2, 16, 4
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * hd).to(dtype)
    q, k, v = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
    q, k, v = q.view(tokens, heads, hd), k.view(tokens, kv_heads, hd), v.view(tokens, kv_heads, hd)
    positions = torch.tensor([0, 5, 6, 7, 30, 2])
    angles = torch.outer(torch.arange(64.0), 1.0 / 10000 ** (torch.arange(0, hd, 2) / hd))
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    slots = torch.tensor([3, 8, 9, 10, 21, 0])
    meta = AttentionMetadata(
        slots=slots,
        tables=torch.zeros(1, 1, dtype=torch.int32),
        rows=torch.zeros(1, dtype=torch.int32),
        query_start=torch.tensor([0, tokens], dtype=torch.int32),
        seq_lens=torch.tensor([tokens], dtype=torch.int32),
        num_decodes=0,
        max_query_len=tokens,
        max_seq_len=tokens,
        backend=CpuKernelBackend,
    )
    c, s = cos[positions].to(dtype).unsqueeze(1), sin[positions].to(dtype).unsqueeze(1)
    want_q = q * c + fused.rotate_half(q) * s
    want_k = k * c + fused.rotate_half(k) * s
    want_caches = CpuKernelBackend.allocate_kv(8, block, kv_heads, hd, dtype)
    CpuKernelBackend.write_kv(*want_caches, want_k, v, meta)

    k_cache, v_cache = CpuKernelBackend.allocate_kv(8, block, kv_heads, hd, dtype)
    CpuKernelBackend.rotary_and_cache(RotaryWrite(q, k, v, positions, cos, sin, k_cache, v_cache, slots))
    torch.testing.assert_close(q, want_q, **TOL[dtype])  # rotated where it lies, inside qkv
    torch.testing.assert_close(k_cache, want_caches[0], **TOL[dtype])
    assert torch.equal(v_cache, want_caches[1])


def test_attention_reads_a_query_view_in_place() -> None:
    heads, kv_heads, hd, block = 4, 2, 16, 4
    qkv = torch.randn(3, (heads + 2 * kv_heads) * hd)
    q = qkv[:, : heads * hd].view(3, heads, hd)  # rows strided by the whole projection
    k_cache, v_cache = CpuKernelBackend.allocate_kv(4, block, kv_heads, hd, torch.float32)
    k_cache.normal_(), v_cache.normal_()
    meta = AttentionMetadata(
        slots=torch.zeros(0, dtype=torch.long),
        tables=torch.tensor([[2, 0], [1, 3], [0, 1]], dtype=torch.int32),
        rows=torch.tensor([0, 1, 2], dtype=torch.int32),
        query_start=torch.tensor([0, 1, 2, 3], dtype=torch.int32),
        seq_lens=torch.tensor([5, 8, 3], dtype=torch.int32),
        num_decodes=3,
        max_query_len=1,
        max_seq_len=8,
        backend=CpuKernelBackend,
    )
    torch.testing.assert_close(
        CpuKernelBackend.attend(q, k_cache, v_cache, meta, 0.25),
        CpuKernelBackend.attend(q.contiguous(), k_cache, v_cache, meta, 0.25),
    )
