"""The paged-attention backends against a plain per-sequence reference (real kernels, real torch)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from engine_fixtures import assert_prebuilt_kernels_loaded, needs_native_kernels
from frontier_runtime.ops.attention import (
    AttentionBackend,
    AttentionMetadata,
    backend,
    flash_varlen,
    sdpa_gather,
    select_backend,
)
from frontier_runtime.ops.attention.flash_varlen import varlen_entry, varlen_keywords

BLOCK = 4


def _step(
    name: str,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    heads: int = 6,
    kv_heads: int = 2,
    hd: int = 16,
):
    """Two decodes and two prefill chunks (one with cached context), blocks scattered in the pool."""
    cls = backend(name)
    gen = torch.Generator().manual_seed(0)
    query_lens = [1, 1, 7, 5]
    seq_lens = [9, 2, 7, 13]  # the last chunk follows 8 cached tokens
    num_blocks = 24
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, used = [], 0
    for n in seq_lens:
        need = -(-n // BLOCK)
        tables.append(perm[used : used + need])
        used += need
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    rows = torch.tensor([2, 0, 3, 1], dtype=torch.int32)  # sequences sit on arbitrary rows
    full = torch.zeros(4, width, dtype=torch.int32)
    full[rows.long()] = table
    k_cache, v_cache = cls.allocate_kv(num_blocks, BLOCK, kv_heads, hd, cache_dtype)
    keys = [torch.randn(n, kv_heads, hd, generator=gen) for n in seq_lens]
    values = [torch.randn(n, kv_heads, hd, generator=gen) for n in seq_lens]
    for t, k, v in zip(tables, keys, values, strict=True):
        slots = torch.tensor([t[p // BLOCK] * BLOCK + p % BLOCK for p in range(k.shape[0])])
        cls.write_kv(k_cache, v_cache, k, v, _meta(cls, slots), 0.05, 0.05)
    q = torch.randn(sum(query_lens), heads, hd, generator=gen).to(dtype)
    qs = [0]
    for n in query_lens:
        qs.append(qs[-1] + n)
    meta = AttentionMetadata(
        slots=torch.zeros(0, dtype=torch.long),
        tables=full,
        rows=rows,
        query_start=torch.tensor(qs, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_decodes=2,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        backend=cls,
        host_query_lens=query_lens,
        host_seq_lens=seq_lens,
    )
    # Reference: each sequence alone, SDPA with the causal mask aligned to its end.
    ref = []
    for i, (n, total) in enumerate(zip(query_lens, seq_lens, strict=True)):
        k = keys[i].to(cache_dtype).float() if cache_dtype != torch.float8_e4m3fn else _fp8(keys[i])
        v = values[i].to(cache_dtype).float() if cache_dtype != torch.float8_e4m3fn else _fp8(values[i])
        qi = q[qs[i] : qs[i + 1]].float().transpose(0, 1)
        mask = torch.arange(total).unsqueeze(0) <= torch.arange(total - n, total).unsqueeze(1)
        o = F.scaled_dot_product_attention(
            qi, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=hd**-0.5, enable_gqa=True
        )
        ref.append(o.transpose(0, 1))
    return q, k_cache, v_cache, meta, torch.cat(ref), hd**-0.5


def _meta(cls: type[AttentionBackend], slots: torch.Tensor) -> AttentionMetadata:
    i32 = torch.zeros(0, dtype=torch.int32)
    return AttentionMetadata(slots, i32, i32, i32, i32, 0, 0, 0, cls)


def _fp8(x: torch.Tensor) -> torch.Tensor:
    return (x / 0.05).to(torch.float8_e4m3fn).float() * 0.05


CASES = [
    (torch.float32, torch.float32, 1e-5),
    (torch.bfloat16, torch.bfloat16, 2e-2),
    (torch.float32, torch.float8_e4m3fn, 1e-4),
    (torch.bfloat16, torch.float8_e4m3fn, 2e-2),
]


@pytest.mark.parametrize("name", [pytest.param("cpu-kernel", marks=needs_native_kernels), "sdpa-gather"])
@pytest.mark.parametrize(("dtype", "cache_dtype", "tol"), CASES)
def test_backends_match_per_sequence_sdpa(
    name: str, dtype: torch.dtype, cache_dtype: torch.dtype, tol: float
) -> None:
    select_backend(torch.device("cpu"), BLOCK, dtype, prefer=name)  # builds the kernel
    q, k_cache, v_cache, meta, ref, scale = _step(name, dtype, cache_dtype)
    out = meta.backend.attend(q, k_cache, v_cache, meta, scale, 0.05, 0.05)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@needs_native_kernels
def test_the_prebuilt_cpu_kernel_loads_here_and_is_chosen() -> None:
    assert_prebuilt_kernels_loaded()
    assert select_backend(torch.device("cpu"), BLOCK, torch.float32).name == "cpu-kernel"


def test_an_unknown_or_unfit_backend_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'flex' is not one of"):
        select_backend(torch.device("cpu"), BLOCK, torch.float32, prefer="flex")
    with pytest.raises(ValueError, match="'flash-varlen' is required but cannot run on cpu: it needs a GPU"):
        select_backend(torch.device("cpu"), BLOCK, torch.float32, prefer="flash-varlen")


def test_a_required_triton_backend_without_a_gpu_or_interpreter_names_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(
        ValueError, match="'triton' is required but cannot run on cpu: Triton is not installed, or"
    ):
        select_backend(torch.device("cpu"), 16, torch.float32, prefer="triton")


# The keywords torch's varlen_attn has taken: today's, and an older form with is_causal and no GQA.
VARLEN_TODAY = frozenset({"scale", "window_size", "enable_gqa", "seqused_k", "block_table"})
VARLEN_OLDER = frozenset({"scale", "is_causal", "seqused_k", "block_table"})


def test_varlen_keywords_are_read_from_the_signature_of_this_torch() -> None:
    assert varlen_keywords(VARLEN_TODAY, causal=True, gqa=True) == {
        "window_size": (-1, 0),
        "enable_gqa": True,
    }
    assert varlen_keywords(VARLEN_OLDER, causal=True, gqa=False) == {"is_causal": True}


def test_the_installed_torch_varlen_attn_takes_every_keyword_the_engine_needs() -> None:
    _, params = varlen_entry()
    assert varlen_keywords(params, causal=True, gqa=True)["enable_gqa"] is True


def test_a_torch_whose_varlen_attn_lacks_gqa_is_refused_naming_the_keyword() -> None:
    with pytest.raises(NotImplementedError, match="takes no enable_gqa"):
        varlen_keywords(VARLEN_OLDER, causal=True, gqa=True)


def test_decode_steps_call_varlen_without_the_causal_window_and_prefills_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel itself needs CUDA: a stand-in records the keywords attend passes it."""
    seen: list[dict] = []

    def varlen_attn(q, k, v, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(kw)
        return torch.zeros_like(q)

    monkeypatch.setattr(flash_varlen, "varlen_entry", lambda: (varlen_attn, VARLEN_TODAY))
    q, k_cache, v_cache, meta, _, scale = _step("flash-varlen", torch.float32, torch.float32)
    meta.backend.attend(q, k_cache, v_cache, meta, scale)
    meta.max_query_len = 1
    meta.backend.attend(q[:2], k_cache, v_cache, meta, scale)
    assert [kw["window_size"] for kw in seen] == [(-1, 0), (-1, -1)]


def test_the_gather_path_builds_its_indices_once_per_step_for_every_layer(
    gqa_ref,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    from frontier_runtime.engine.llm_engine import LLMEngine
    from frontier_runtime.requests import SamplingParams

    plans = []
    build = sdpa_gather.gather_plan
    monkeypatch.setattr(sdpa_gather, "gather_plan", lambda *a: plans.append(1) or build(*a))
    engine = LLMEngine(gqa_ref.model_dir, attention_backend="sdpa-gather", max_batch_size=4)
    steps_before = engine.stats().steps
    plans.clear()
    engine.generate(gqa_ref.prompts[:2], SamplingParams(max_tokens=3, temperature=0.0))
    assert engine.runner.model_config.num_layers > 1
    assert len(plans) == engine.stats().steps - steps_before


def test_the_engine_on_the_portable_sdpa_path_equals_transformers(gqa_ref) -> None:  # noqa: ANN001
    """The path CUDA takes without the paged flash kernel (and CPU without a compiler), batched,
    with chunked prefills behind cached context: still token for token transformers' greedy."""
    from engine_fixtures import MAX_NEW
    from frontier_runtime.engine.llm_engine import LLMEngine
    from frontier_runtime.requests import SamplingParams

    engine = LLMEngine(
        gqa_ref.model_dir, attention_backend="sdpa-gather", max_batch_size=8, max_num_batched_tokens=16
    )
    assert engine.runner.backend.name == "sdpa-gather"
    out = engine.generate(gqa_ref.prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0.0))
    assert out == gqa_ref.outputs
