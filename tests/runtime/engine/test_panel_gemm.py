"""The panel GEMM computes a linear layer as torch does, and a row's result never depends on its batch."""

from __future__ import annotations

import pytest
import torch
from engine_fixtures import assert_prebuilt_kernels_loaded, needs_native_kernels
from frontier_runtime.models.llama.layers import Linear
from frontier_runtime.ops import cpu_kernel, panel_gemm

pytestmark = needs_native_kernels


@pytest.fixture(autouse=True)
def _gemm_loaded() -> None:
    # The panel GEMM is in the avx512 variant alone; the machines that run these tests have AVX-512.
    assert_prebuilt_kernels_loaded()
    assert panel_gemm.available(), (
        f"the panel GEMM is in the avx512 variant; this CPU took {cpu_kernel.variant()}"
    )


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ w.double().t()
    return (out if b is None else out + b.double()).float()


@pytest.mark.parametrize("rows", [1, 5, 8, 13, 64, 300, 700])
@pytest.mark.parametrize(("n", "k"), [(96, 64), (100, 70), (33, 300), (7, 129)])
def test_it_matches_a_float64_product_at_any_shape(rows: int, n: int, k: int) -> None:
    x, w = torch.randn(rows, k), torch.randn(n, k)
    got = panel_gemm.linear(x, panel_gemm.pack(w), n)
    torch.testing.assert_close(got, _reference(x, w, None), atol=1e-4, rtol=1e-4)


def test_the_bias_is_added_to_every_row() -> None:
    x, w, b = torch.randn(19, 48), torch.randn(50, 48), torch.randn(50)
    got = panel_gemm.linear(x, panel_gemm.pack(w), 50, b)
    torch.testing.assert_close(got, _reference(x, w, b), atol=1e-4, rtol=1e-4)


def test_rows_read_through_a_stride_and_leading_dims_are_kept() -> None:
    wide, w = torch.randn(6, 4, 80), torch.randn(40, 64)
    x = wide[..., 8:72]  # rows 80 floats apart
    got = panel_gemm.linear(x, panel_gemm.pack(w), 40)
    assert got.shape == (6, 4, 40)
    torch.testing.assert_close(
        got, _reference(x.reshape(-1, 64), w, None).view(6, 4, 40), atol=1e-4, rtol=1e-4
    )


@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_result_is_bitwise_the_same_in_any_batch(threads: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w = panel_gemm.pack(torch.randn(200, 520))
        batch = torch.randn(600, 520)  # past the size where threads split rows instead of panels
        whole = panel_gemm.linear(batch, w, 200)
        for lo, hi in [(0, 1), (3, 12), (100, 164), (0, 300), (599, 600)]:
            assert torch.equal(panel_gemm.linear(batch[lo:hi], w, 200), whole[lo:hi])
    finally:
        torch.set_num_threads(before)


def test_pack_and_unpack_round_trip_a_weight() -> None:
    w = torch.randn(45, 33)
    assert panel_gemm.pack(w).shape == (2, 33, 32)
    assert torch.equal(panel_gemm.unpack(panel_gemm.pack(w), 45), w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cpu_linear_layer_multiplies_by_its_panels(dtype: torch.dtype) -> None:
    layer = Linear(48, 40, bias=True).to(dtype).requires_grad_(False)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    x = torch.randn(9, 48).to(dtype)
    want = torch.nn.functional.linear(x.float(), weight.float(), bias.float()).to(dtype)
    layer.use_transposed_weight()
    layer.pack()
    if dtype == torch.float32 or layer.widen:  # a bf16 layer on a CPU with native bf16 GEMM stays bf16
        assert layer.panels and layer.packed is not None
        assert torch.equal(layer.dense_weight().to(dtype), weight)
    torch.testing.assert_close(
        layer(x), want, **({} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2))
    )


def test_a_long_cpu_mlp_pass_runs_in_blocks_with_the_same_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    from frontier_runtime.distributed import SINGLE
    from frontier_runtime.models.llama import layers
    from frontier_runtime.models.llama.config import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=64,
    )
    mlp = layers.MLP(cfg, SINGLE).requires_grad_(False)
    for proj in (mlp.gate_up_proj, mlp.down_proj):
        proj.use_transposed_weight()
        proj.pack()
    x = torch.randn(300, 64)
    whole = mlp(x)
    monkeypatch.setattr(layers, "MLP_BLOCK_BYTES", 64 * 2 * 96 * 4)  # 64-row blocks
    assert mlp.block_rows(x) == 64
    assert torch.equal(mlp(x), whole)
