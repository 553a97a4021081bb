"""The Triton kernels of ``triton_fused`` compute what the torch expressions they replace compute.

They run here on CPU tensors under Triton's interpreter. Where every step is one IEEE operation the
results are equal bit for bit; where torch adds up a float32 sum in another order or calls another
``exp`` (RMSNorm's mean square, SiLU), float32 results are within a few ulps and bfloat16 ones,
rounded from them, within one.
"""

from __future__ import annotations

import os

# Triton decides between compiling and interpreting when a kernel is defined, reading this once on
# its first import: set before anything imports triton so the kernels run on CPU tensors here.
os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from engine_fixtures import Reference  # noqa: E402
from frontier_runtime.engine.llm_engine import LLMEngine  # noqa: E402
from frontier_runtime.models.llama import quant  # noqa: E402
from frontier_runtime.ops import fused, panel_gemm, triton_fused  # noqa: E402
from frontier_runtime.ops.attention import AttentionMetadata, RotaryWrite, TritonBackend, backend  # noqa: E402
from frontier_runtime.requests import SamplingParams  # noqa: E402

FP8 = torch.float8_e4m3fn
DTYPES = [torch.float32, torch.bfloat16]
# Float32 results of a reduction or an exp computed otherwise than torch's; bfloat16 rounds them.
ULPS = {torch.float32: 4, torch.bfloat16: 1}


def ulp_distance(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """How many representable values apart each pair is (+0 and -0 count as one value)."""
    assert got.dtype == want.dtype

    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = (t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)).long()
        sign_bit = 1 << (31 if t.dtype == torch.float32 else 15)
        return torch.where(bits < 0, -(bits + sign_bit), bits)

    return (ordered(got) - ordered(want)).abs()


def norm_expression(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.fixture
def forced_on_cpu() -> Iterator[None]:
    triton_fused.force_on_cpu(True)
    try:
        yield
    finally:
        triton_fused.force_on_cpu(False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [96, 67, 1003])
def test_rms_norm_matches_the_torch_expression(dtype: torch.dtype, hidden: int) -> None:
    gen = torch.Generator().manual_seed(hidden)
    x, w = torch.randn(9, hidden, generator=gen).to(dtype), torch.randn(hidden, generator=gen).to(dtype)
    out, stream = triton_fused.rms_norm(x, w, 1e-5)
    assert ulp_distance(out, norm_expression(x, w, 1e-5)).max() <= ULPS[dtype]
    assert stream is x


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_adds_the_residual_in_place_first(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    x, r = torch.randn(2, 3, 67, generator=gen).to(dtype), torch.randn(2, 3, 67, generator=gen).to(dtype)
    w = torch.randn(67, generator=gen).to(dtype)
    want_sum = r + x
    out, stream = triton_fused.rms_norm(x, w, 1e-6, residual=r)
    assert stream is r and torch.equal(r, want_sum)
    assert ulp_distance(out, norm_expression(want_sum, w, 1e-6)).max() <= ULPS[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [80, 37, 1100])  # 1100: more than one block of columns per row
def test_silu_and_mul_matches_the_torch_expression(dtype: torch.dtype, inter: int) -> None:
    gen = torch.Generator().manual_seed(inter)
    gate_up = (torch.randn(5, 2 * inter, generator=gen) * 4).to(dtype)  # both tails of the sigmoid
    gate, up = gate_up.split(inter, dim=-1)
    assert ulp_distance(triton_fused.silu_and_mul(gate_up), F.silu(gate) * up).max() <= ULPS[dtype]


@dataclass(frozen=True)
class Heads:
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def widths(self) -> list[int]:
        return [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]


GQA = Heads(4, 2, 16)
ODD = Heads(6, 3, 24)  # head counts and a half head_dim that are no powers of two
TOKENS, BLOCK = 6, 4
POSITIONS = torch.tensor([0, 5, 6, 7, 30, 2])
SLOTS = torch.tensor([3, 8, 9, 10, 21, 0])


def rope_tables(head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.outer(torch.arange(64.0), 1.0 / 10000 ** (torch.arange(0, head_dim, 2) / head_dim))
    emb = torch.cat([angles, angles], -1)
    return emb.cos(), emb.sin()


def fused_qkv(dtype: torch.dtype, seed: int, geo: Heads = GQA, scale: float = 3.0) -> torch.Tensor:
    """A projection's output, [tokens, (heads + 2 kv_heads) * head_dim]."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(TOKENS, sum(geo.widths), generator=gen) * scale).to(dtype)


def split_qkv(qkv: torch.Tensor, geo: Heads) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views into the projection: rows strided by its whole width."""
    q, k, v = qkv.split(geo.widths, dim=-1)
    return (
        q.view(TOKENS, geo.heads, geo.head_dim),
        k.view(TOKENS, geo.kv_heads, geo.head_dim),
        v.view(TOKENS, geo.kv_heads, geo.head_dim),
    )


def flash_meta() -> AttentionMetadata:
    return AttentionMetadata(
        slots=SLOTS,
        tables=torch.zeros(1, 1, dtype=torch.int32),
        rows=torch.zeros(1, dtype=torch.int32),
        query_start=torch.tensor([0, TOKENS], dtype=torch.int32),
        seq_lens=torch.tensor([TOKENS], dtype=torch.int32),
        num_decodes=0,
        max_query_len=TOKENS,
        max_seq_len=TOKENS,
        backend=TritonBackend,
    )


def rotate_and_write(
    qkv: torch.Tensor, geo: Heads, cache_dtype: torch.dtype, k_scale: float = 1.0, v_scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's caches after one call on views into ``qkv`` (q is rotated inside ``qkv``)."""
    cos, sin = rope_tables(geo.head_dim)
    k_cache, v_cache = TritonBackend.allocate_kv(8, BLOCK, geo.kv_heads, geo.head_dim, cache_dtype)
    triton_fused.rotary_and_write_kv(
        *split_qkv(qkv, geo), POSITIONS, cos, sin, k_cache, v_cache, SLOTS, k_scale, v_scale
    )
    return k_cache, v_cache


def rotated_by_torch(qkv: torch.Tensor, geo: Heads) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, _ = split_qkv(qkv, geo)
    return fused.rotary(q, k, POSITIONS, *rope_tables(geo.head_dim))


def written_by_torch(
    qkv: torch.Tensor, geo: Heads, cache_dtype: torch.dtype, k_scale: float = 1.0, v_scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    _, k, v = split_qkv(qkv, geo)
    _, k_rot = rotated_by_torch(qkv, geo)
    k_cache, v_cache = TritonBackend.allocate_kv(8, BLOCK, geo.kv_heads, geo.head_dim, cache_dtype)
    TritonBackend.write_kv(k_cache, v_cache, k_rot, v, flash_meta(), k_scale, v_scale)
    return k_cache, v_cache


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geo", [GQA, ODD])
def test_q_is_rotated_in_place_through_its_strides_as_torch_rotates_it(
    dtype: torch.dtype, geo: Heads
) -> None:
    qkv = fused_qkv(dtype, seed=2, geo=geo)
    want_q, _ = rotated_by_torch(qkv, geo)
    rotate_and_write(qkv, geo, dtype)
    assert torch.equal(split_qkv(qkv, geo)[0], want_q)


@pytest.mark.parametrize("dtype", DTYPES)
def test_k_and_v_in_the_projection_are_left_as_they_were(dtype: torch.dtype) -> None:
    qkv = fused_qkv(dtype, seed=3)
    before = qkv.clone()
    rotate_and_write(qkv, GQA, dtype)
    q_width = GQA.widths[0]
    assert torch.equal(qkv[:, q_width:], before[:, q_width:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geo", [GQA, ODD])
def test_rotated_k_and_v_land_at_their_slots_as_write_kv_puts_them(dtype: torch.dtype, geo: Heads) -> None:
    qkv = fused_qkv(dtype, seed=4, geo=geo)
    want_k, want_v = written_by_torch(qkv, geo, dtype)
    k_cache, v_cache = rotate_and_write(qkv, geo, dtype)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("k_scale", "v_scale", "magnitude"),
    [
        (1.0, 1.0, 3.0),  # bf16 values on e4m3's rounding ties: ties go to even
        (0.37, 0.05, 30.0),  # past ±448 once scaled: clamped
        (2.5, 1.3, 0.01),  # under e4m3's smallest normal (2^-6) once scaled: subnormals
    ],
)
def test_an_fp8_cache_gets_the_bytes_write_kv_writes(
    dtype: torch.dtype, k_scale: float, v_scale: float, magnitude: float
) -> None:
    qkv = fused_qkv(dtype, seed=5, scale=magnitude)
    want_k, want_v = written_by_torch(qkv, GQA, FP8, k_scale, v_scale)
    k_cache, v_cache = rotate_and_write(qkv, GQA, FP8, k_scale, v_scale)
    assert torch.equal(k_cache.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), want_v.view(torch.uint8))


def test_a_step_without_tokens_writes_nothing() -> None:
    q, k, v = split_qkv(torch.zeros(TOKENS, sum(GQA.widths)), GQA)
    k_cache, v_cache = TritonBackend.allocate_kv(2, BLOCK, GQA.kv_heads, GQA.head_dim, torch.float32)
    no_index = torch.zeros(0, dtype=torch.long)
    cos, sin = rope_tables(GQA.head_dim)
    triton_fused.rotary_and_write_kv(q[:0], k[:0], v[:0], no_index, cos, sin, k_cache, v_cache, no_index)
    assert not k_cache.any() and not v_cache.any()


@triton.jit
def native_casts(x_ptr, bf16_ptr, fp8_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    tl.store(bf16_ptr + offs, x.to(tl.bfloat16))
    tl.store(fp8_ptr + offs, x.to(tl.float8e4nv).to(tl.uint8, bitcast=True))


def interpreter_casts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    bf16, fp8 = torch.empty(x.shape, dtype=torch.bfloat16), torch.empty(x.shape, dtype=torch.uint8)
    native_casts[(1,)](x, bf16, fp8, N=x.numel())
    return bf16, fp8


def test_the_interpreter_truncates_float32_to_bfloat16_so_the_kernels_round_on_the_bits() -> None:
    x = torch.tensor([1 + 0.75 * 2**-7, -(1 + 0.75 * 2**-7)])  # nearest bfloat16: ±(1 + 2^-7)
    bf16, _ = interpreter_casts(x)
    assert bf16.tolist() == [1.0, -1.0] != x.bfloat16().tolist()


def test_the_interpreter_loses_the_fp8_carry_into_the_exponent_so_the_kernels_round_on_the_bits() -> None:
    x = torch.tensor([31.5, -31.5])  # nearest e4m3: ±32, a carry out of the 3-bit mantissa
    _, fp8 = interpreter_casts(x)
    assert fp8.view(FP8).tolist() == [16.0, -16.0] != x.to(FP8).float().tolist()


def counting(calls: dict[str, int], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return fn(*args, **kwargs)

    return counted


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often ``fused`` calls each kernel."""
    names = ("rms_norm", "silu_and_mul", "rotary_and_write_kv")
    calls = dict.fromkeys(names, 0)
    for name in names:
        monkeypatch.setattr(triton_fused, name, counting(calls, name, getattr(triton_fused, name)))
    return calls


FLASH_LAYOUT_BACKENDS = ["triton", "flash-varlen", "sdpa-gather"]


def run_fused_ops(name: str) -> None:
    """One call of each of ``fused``'s steps on CPU tensors, as a decoder layer makes them."""
    x = torch.randn(TOKENS, 64)
    fused.rms_norm(x, torch.ones(64), 1e-6, residual=torch.zeros(TOKENS, 64))
    fused.silu_and_mul(x)
    q, k, v = split_qkv(torch.randn(TOKENS, sum(GQA.widths)), GQA)
    cls = backend(name)
    k_cache, v_cache = cls.allocate_kv(8, BLOCK, GQA.kv_heads, GQA.head_dim, torch.float32)
    if cls.can_rotate_into_cache(q, k_cache):
        cos, sin = rope_tables(GQA.head_dim)
        cls.rotary_and_cache(RotaryWrite(q, k, v, POSITIONS, cos, sin, k_cache, v_cache, SLOTS))


@pytest.mark.parametrize("name", FLASH_LAYOUT_BACKENDS)
def test_cpu_tensors_keep_to_the_cpu_paths(name: str, kernel_calls: dict[str, int]) -> None:
    run_fused_ops(name)
    assert not any(kernel_calls.values()), kernel_calls


@pytest.mark.parametrize("name", FLASH_LAYOUT_BACKENDS)
def test_forced_on_cpu_every_step_goes_through_the_kernels(
    name: str, forced_on_cpu: None, kernel_calls: dict[str, int]
) -> None:
    run_fused_ops(name)
    assert kernel_calls == dict.fromkeys(kernel_calls, 1)


@pytest.mark.parametrize(
    ("cache_dtype", "offered"), [(torch.float32, True), (FP8, True), (torch.bfloat16, False)]
)
def test_rotation_into_the_cache_is_offered_for_a_cache_of_q_dtype_or_fp8(
    cache_dtype: torch.dtype, offered: bool, forced_on_cpu: None
) -> None:
    q = torch.zeros(1, GQA.heads, GQA.head_dim)  # float32
    k_cache = torch.zeros(1, BLOCK, GQA.kv_heads, GQA.head_dim, dtype=cache_dtype)
    assert TritonBackend.can_rotate_into_cache(q, k_cache) == offered


# The interpreter runs each kernel in milliseconds: the shorter prompts, a few steps each.
NEW_TOKENS = 4
PROMPTS = 4


def greedy(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    return engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0))


@pytest.mark.slow
def test_a_tiny_engine_through_the_kernels_matches_transformers(
    tied_ref: Reference, forced_on_cpu: None, kernel_calls: dict[str, int]
) -> None:
    engine = LLMEngine(tied_ref.model_dir, attention_backend="triton", max_batch_size=PROMPTS)
    want = [out[:NEW_TOKENS] for out in tied_ref.outputs[:PROMPTS]]
    assert greedy(engine, tied_ref.prompts[:PROMPTS]) == want
    assert all(kernel_calls.values()), kernel_calls


@pytest.mark.slow
def test_a_bf16_engine_with_an_fp8_cache_gives_the_same_tokens_through_the_kernels_as_without(
    tied_ref: Reference, forced_on_cpu: None, kernel_calls: dict[str, int]
) -> None:
    settings = dict(
        attention_backend="triton", dtype="bfloat16", kv_cache_dtype="fp8", max_batch_size=PROMPTS
    )
    got = greedy(LLMEngine(tied_ref.model_dir, **settings), tied_ref.prompts[:PROMPTS])
    assert all(kernel_calls.values()), kernel_calls
    triton_fused.force_on_cpu(False)
    assert greedy(LLMEngine(tied_ref.model_dir, **settings), tied_ref.prompts[:PROMPTS]) == got


# -- weight-only GEMM: int8 and fp8 weights widened in registers -------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", [quant.Int8, quant.Fp8], ids=lambda m: m.name)
@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_weight_only_linear_matches_the_dequantize_then_multiply_expression(
    dtype: torch.dtype, method: type[quant.QuantizationMethod], rows: int, with_bias: bool
) -> None:
    gen = torch.Generator().manual_seed(rows)
    ins, outs = 300, 200  # neither a multiple of a tile
    x = torch.randn(rows, ins, generator=gen).to(dtype)
    weight = method.quantize(torch.randn(outs, ins, generator=gen))
    bias = torch.randn(outs, generator=gen).to(dtype) if with_bias else None
    got = triton_fused.weight_only_linear(x, weight.qweight, weight.scale, bias)
    want = quant.QuantizationMethod.linear(x, weight.qweight, weight.scale, bias, panels=False)
    if dtype == torch.bfloat16:
        # Products of bfloat16 and a widened int8 or e4m3 are exact in float32, and the sums here
        # round to the same bfloat16 whatever their order.
        assert torch.equal(got, want)
    else:
        # float32 sums in another order: within a few ulps of the largest partial sum.
        magnitude = (x.abs() @ weight.dequantize().abs().T) + (bias.abs() if bias is not None else 0)
        assert ((got - want).abs() <= 8 * torch.finfo(torch.float32).eps * magnitude).all()


def test_weight_only_linear_keeps_the_leading_dimensions_and_reads_strided_rows() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = quant.Int8.quantize(torch.randn(48, 40, generator=gen))
    wide = torch.randn(2, 3, 80, generator=gen)[..., ::2]  # last dimension strided
    got = triton_fused.weight_only_linear(wide, weight.qweight, weight.scale, None)
    want = quant.QuantizationMethod.linear(
        wide.contiguous(), weight.qweight, weight.scale, None, panels=False
    )
    assert got.shape == (2, 3, 48)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("rows", "kernel"), [(1, True), (triton_fused.WEIGHT_ONLY_ROWS, True), (17, False)])
def test_a_decode_steps_rows_take_the_weight_only_kernel_and_a_prefills_do_not(
    rows: int, kernel: bool, forced_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"weight_only_linear": 0}
    spied = counting(calls, "weight_only_linear", triton_fused.weight_only_linear)
    monkeypatch.setattr(triton_fused, "weight_only_linear", spied)
    weight = quant.Int8.quantize(torch.randn(32, 64))
    x = torch.randn(rows, 64)
    out = quant.Int8.linear(x, weight.qweight, weight.scale, None, panels=False)
    assert calls["weight_only_linear"] == int(kernel) and out.shape == (rows, 32)


@pytest.mark.slow
def test_an_int8_engine_decodes_the_same_tokens_through_the_weight_only_kernel_as_through_torch(
    tied_ref: Reference, forced_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every decode step's projections through the kernel (prefill's rows past the tile stay torch's);
    against the same engine on torch's int8 weight GEMM, the native panels off as on a GPU host."""
    monkeypatch.setattr(panel_gemm, "available", lambda: False)
    calls = {"weight_only_linear": 0}
    spied = counting(calls, "weight_only_linear", triton_fused.weight_only_linear)
    monkeypatch.setattr(triton_fused, "weight_only_linear", spied)
    settings = dict(attention_backend="triton", dtype="bfloat16", quantization="int8", max_batch_size=PROMPTS)
    got = greedy(LLMEngine(tied_ref.model_dir, **settings), tied_ref.prompts[:PROMPTS])
    assert calls["weight_only_linear"] > 0
    triton_fused.force_on_cpu(False)
    assert greedy(LLMEngine(tied_ref.model_dir, **settings), tied_ref.prompts[:PROMPTS]) == got


@dataclass
class CudaRows:
    """What ``weight_only_applies`` reads of a CUDA tensor (no GPU here: the capability is injected)."""

    rows: int
    width: int = 64
    is_cuda: bool = True
    device: str = "cuda:0"

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.width)

    def numel(self) -> int:
        return self.rows * self.width


@pytest.mark.parametrize(
    ("capability", "weights", "takes"),
    [
        ((7, 5), torch.int8, False),  # no bf16 tensor-core products
        ((8, 0), torch.int8, True),
        ((8, 0), FP8, False),  # Triton has no float8e4nv before sm89: an A100 keeps dequantizing
        ((8, 9), FP8, True),
        ((9, 0), FP8, True),
    ],
)
def test_the_weight_only_kernel_is_offered_only_to_gpus_whose_triton_multiplies_the_weight_type(
    capability: tuple[int, int], weights: torch.dtype, takes: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(triton_fused, "applies", lambda x: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    qweight = torch.zeros(32, 64, dtype=weights)
    assert triton_fused.weight_only_applies(CudaRows(rows=4), qweight) is takes  # type: ignore[arg-type]
    assert not triton_fused.weight_only_applies(CudaRows(rows=17), qweight)  # type: ignore[arg-type]
