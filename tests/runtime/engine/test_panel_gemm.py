"""The panel GEMM computes a linear layer as torch does, and a row's result never depends on its batch."""

from __future__ import annotations

import pytest
import torch
from engine_fixtures import MAX_NEW, Reference, assert_prebuilt_kernels_loaded, needs_native_kernels
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


needs_bf16_gemm = pytest.mark.skipif(
    not panel_gemm.bf16_available(),
    reason="the bf16 panel GEMM is in the avx512bf16 variant (AVX512-BF16 CPUs)",
)


def _assert_bf16_close(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    """Within one bf16 rounding of the float64 product, plus float32 summation error."""
    assert got.dtype == torch.bfloat16
    want = _reference(x, w, b).double()
    budget = x.double().abs() @ w.double().abs().t()  # what the float32 sums can lose against
    error = (got.double() - want).abs()
    assert (error <= want.abs() * 2**-8 + budget * 2**-20 + 1e-30).all(), error.max().item()


@needs_bf16_gemm
@pytest.mark.parametrize("rows", [1, 5, 8, 13, 64, 300, 700])
@pytest.mark.parametrize(("n", "k"), [(96, 64), (100, 70), (33, 600), (7, 130)])
def test_the_bf16_gemm_matches_a_float64_product_within_bf16_rounding(rows: int, n: int, k: int) -> None:
    x, w, b = torch.randn(rows, k).bfloat16(), torch.randn(n, k).bfloat16(), torch.randn(n)
    _assert_bf16_close(panel_gemm.linear_bf16(x, panel_gemm.pack_bf16(w), n, b), x, w, b)
    _assert_bf16_close(panel_gemm.linear_bf16(x, panel_gemm.pack_bf16(w), n), x, w, None)
    # Float32 out (the logits): the sums unrounded, within float32 summation error of float64.
    got = panel_gemm.linear_bf16(x, panel_gemm.pack_bf16(w), n, b, torch.float32)
    assert got.dtype == torch.float32
    budget = x.double().abs() @ w.double().abs().t()
    assert ((got.double() - _reference(x, w, b).double()).abs() <= budget * 2**-20 + 1e-6).all()


@needs_bf16_gemm
def test_the_bf16_gemm_reads_rows_through_a_stride_and_keeps_leading_dims() -> None:
    wide, w = torch.randn(6, 4, 80).bfloat16(), torch.randn(40, 64).bfloat16()
    x = wide[..., 8:72]
    got = panel_gemm.linear_bf16(x, panel_gemm.pack_bf16(w), 40)
    assert got.shape == (6, 4, 40)
    _assert_bf16_close(got.reshape(-1, 40), x.reshape(-1, 64), w, None)


@needs_bf16_gemm
@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_bf16_result_is_bitwise_the_same_in_any_batch(threads: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w = panel_gemm.pack_bf16(torch.randn(200, 520).bfloat16())
        batch = torch.randn(600, 520).bfloat16()
        whole = panel_gemm.linear_bf16(batch, w, 200)
        for lo, hi in [(0, 1), (3, 12), (100, 164), (0, 300), (599, 600)]:
            assert torch.equal(panel_gemm.linear_bf16(batch[lo:hi], w, 200), whole[lo:hi])
    finally:
        torch.set_num_threads(before)


def test_bf16_pair_panels_round_trip_a_weight_and_refuse_an_odd_k() -> None:
    w = torch.randn(45, 34).bfloat16()
    assert panel_gemm.pack_bf16(w).shape == (2, 17, 32, 2)
    assert torch.equal(panel_gemm.unpack_bf16(panel_gemm.pack_bf16(w), 45), w)
    with pytest.raises(ValueError, match="even K"):
        panel_gemm.pack_bf16(torch.randn(8, 33).bfloat16())


@needs_bf16_gemm
@pytest.mark.parametrize(("k", "bf16_panels"), [(48, True), (47, False)])
def test_a_bf16_layer_on_a_bf16_cpu_keeps_bf16_panels(k: int, bf16_panels: bool) -> None:
    layer = Linear(k, 40, bias=True).to(torch.bfloat16).requires_grad_(False)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    x = torch.randn(9, k).bfloat16()
    layer.use_transposed_weight()
    layer.pack()
    assert layer.bf16_panels == bf16_panels and not layer.widen  # an odd K stays with oneDNN's bf16 GEMM
    if bf16_panels:
        assert layer.packed is not None and layer.packed.dtype == torch.bfloat16 and layer.weight is None
    assert torch.equal(layer.dense_weight(), weight)
    got = layer(x)
    assert got.dtype == torch.bfloat16
    _assert_bf16_close(got, x, weight, bias.float())


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


@needs_bf16_gemm
def test_a_bf16_engine_on_a_bf16_cpu_runs_every_linear_on_bf16_panels_and_batches_as_it_runs_alone(
    gqa_ref: Reference,
) -> None:
    from frontier_runtime.engine.llm_engine import LLMEngine
    from frontier_runtime.requests import SamplingParams

    greedy = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
    engine = LLMEngine(gqa_ref.model_dir, dtype="bfloat16", max_batch_size=16)
    linears = [m for m in engine.runner.model.modules() if isinstance(m, Linear)]
    assert linears and all(m.bf16_panels and m.packed is not None for m in linears)
    assert all(m.packed.dtype == torch.bfloat16 for m in linears if m.packed is not None)
    batched = engine.generate(gqa_ref.prompts, greedy)
    alone = LLMEngine(gqa_ref.model_dir, dtype="bfloat16", max_batch_size=1)
    assert [alone.generate([p], greedy)[0] for p in gqa_ref.prompts] == batched
