"""Sliding-window attention (Mistral's, and Qwen's sliding layers) as transformers computes it.

transformers masks ``kv_idx > q_idx - sliding_window`` on top of the causal mask: the query at
position ``p`` sees keys ``p - w + 1 .. p``, its own included. The backends are checked against that
mask over a step of decodes and prefill chunks with contexts longer than the window; the engine is
checked token for token against transformers' greedy ``generate`` on random checkpoints whose
prompts and outputs run well past the window (prefill, decode, chunked prefill, prefix-cache hits).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from engine_fixtures import (
    MAX_NEW,
    Reference,
    assert_prebuilt_kernels_loaded,
    needs_native_kernels,
)
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.models.llama import LlamaConfig
from frontier_runtime.ops import attention
from frontier_runtime.ops.attention import AttentionMetadata
from frontier_runtime.ops.attention.flash_varlen import varlen_keywords
from test_model_families import GREEDY, VOCAB, transformers_greedy, write_checkpoint

# Two shapes, each with a window far shorter than its prompts + outputs (up to ~100 tokens).
SHAPES: dict[str, dict[str, Any]] = {
    "window16": {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "sliding_window": 16},
    "window32": {"hidden_size": 128, "intermediate_size": 128, "num_attention_heads": 8,
                 "num_key_value_heads": 2, "head_dim": 32, "sliding_window": 32},
}  # fmt: skip


# ---- the backends against the mask -------------------------------------------------------------


def _windowed_step(backend: str, block_size: int, dtype: torch.dtype, seed: int = 0):  # noqa: ANN202
    """Two decodes far past the window, a chunk over a long cached prefix, a whole long prefill."""
    gen = torch.Generator().manual_seed(seed)
    heads, kv_heads, hd = 4, 2, 16
    query_lens = [1, 1, 9, 40]
    seq_lens = [45, 3, 50, 40]
    perm = torch.randperm(64, generator=gen).tolist()
    tables, used = [], 0
    for n in seq_lens:
        need = -(-n // block_size)
        tables.append(perm[used : used + need])
        used += need
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    cls = attention.backend(backend)
    k_cache, v_cache = cls.allocate_kv(64, block_size, kv_heads, hd, dtype)
    keys = [torch.randn(n, kv_heads, hd, generator=gen) for n in seq_lens]
    values = [torch.randn(n, kv_heads, hd, generator=gen) for n in seq_lens]
    for t, k, v in zip(tables, keys, values, strict=True):
        slots = torch.tensor([t[p // block_size] * block_size + p % block_size for p in range(k.shape[0])])
        i32 = torch.zeros(0, dtype=torch.int32)
        cls.write_kv(k_cache, v_cache, k, v, AttentionMetadata(slots, i32, i32, i32, i32, 0, 0, 0, cls))
    q = torch.randn(sum(query_lens), heads, hd, generator=gen).to(dtype)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    meta = AttentionMetadata(
        slots=torch.zeros(0, dtype=torch.long),
        tables=table,
        rows=torch.arange(len(seq_lens), dtype=torch.int32),
        query_start=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_decodes=2,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        backend=cls,
        host_query_lens=query_lens,
        host_seq_lens=seq_lens,
    )
    return q, k_cache, v_cache, meta, keys, values


def _masked_reference(
    q: torch.Tensor,
    meta: AttentionMetadata,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    window: int,
) -> torch.Tensor:
    """Each sequence alone: SDPA under transformers' sliding mask, aligned to the sequence's end."""
    assert meta.host_query_lens is not None and meta.host_seq_lens is not None
    out, t0 = [], 0
    for n, total, k, v in zip(meta.host_query_lens, meta.host_seq_lens, keys, values, strict=True):
        q_idx = torch.arange(total - n, total).unsqueeze(1)
        kv_idx = torch.arange(total).unsqueeze(0)
        mask = (kv_idx <= q_idx) & (kv_idx > q_idx - window)
        qi = q[t0 : t0 + n].float().transpose(0, 1)
        o = F.scaled_dot_product_attention(
            qi, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=0.25, enable_gqa=True
        )
        out.append(o.transpose(0, 1))
        t0 += n
    return torch.cat(out)


BACKENDS = [pytest.param("cpu-kernel", marks=needs_native_kernels), "sdpa-gather"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("block_size", "window"), [(16, 16), (16, 5), (4, 1), (4, 13), (16, 100)])
def test_each_query_attends_to_its_last_window_keys_only(backend: str, block_size: int, window: int) -> None:
    if backend == "cpu-kernel":
        assert_prebuilt_kernels_loaded()
    q, k_cache, v_cache, meta, keys, values = _windowed_step(backend, block_size, torch.float32)
    got = meta.backend.attend(q, k_cache, v_cache, meta, 0.25, window=window)
    torch.testing.assert_close(got, _masked_reference(q, meta, keys, values, window), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bfloat16_cache_within_a_window_matches_the_mask(backend: str) -> None:
    if backend == "cpu-kernel":
        assert_prebuilt_kernels_loaded()
    q, k_cache, v_cache, meta, keys, values = _windowed_step(backend, 16, torch.bfloat16, seed=1)
    got = meta.backend.attend(q, k_cache, v_cache, meta, 0.25, window=7)
    want = _masked_reference(
        q, meta, [k.bfloat16().float() for k in keys], [v.bfloat16().float() for v in values], 7
    )
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layers_with_and_without_a_window_share_one_step(backend: str) -> None:
    # sdpa-gather keeps one plan per window in the step's metadata: the second must not reuse the first's.
    if backend == "cpu-kernel":
        assert_prebuilt_kernels_loaded()
    q, k_cache, v_cache, meta, keys, values = _windowed_step(backend, 16, torch.float32, seed=2)
    windowed = meta.backend.attend(q, k_cache, v_cache, meta, 0.25, window=8)
    full = meta.backend.attend(q, k_cache, v_cache, meta, 0.25)
    total = max(meta.host_seq_lens or [0])
    torch.testing.assert_close(windowed, _masked_reference(q, meta, keys, values, 8), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full, _masked_reference(q, meta, keys, values, total), atol=1e-5, rtol=1e-5)


# torch's varlen_attn passes window_size to FlashAttention as (left, right), aligned to the keys' end.
VARLEN_TODAY = frozenset({"scale", "window_size", "enable_gqa", "seqused_k", "block_table"})
VARLEN_OLDER = frozenset({"scale", "is_causal", "seqused_k", "block_table"})


def test_flash_varlen_is_asked_for_the_window_less_the_querys_own_key_on_its_left() -> None:
    for causal in (True, False):  # prefill steps and decode steps alike
        assert varlen_keywords(VARLEN_TODAY, causal=causal, gqa=False, window=16) == {"window_size": (15, 0)}


def test_a_torch_whose_varlen_attn_takes_no_window_is_refused_for_a_windowed_model() -> None:
    with pytest.raises(NotImplementedError, match="takes no window_size"):
        varlen_keywords(VARLEN_OLDER, causal=True, gqa=False, window=16)


def test_a_negative_window_is_refused() -> None:
    q, k_cache, v_cache, meta, _, _ = _windowed_step("sdpa-gather", 16, torch.float32)
    with pytest.raises(ValueError, match=r"attention window -1 must be >= 0"):
        meta.backend.attend(q, k_cache, v_cache, meta, 0.25, window=-1)


# ---- which layers slide: transformers' reading of config.json ----------------------------------


def _config(model_type: str, **fields: Any) -> LlamaConfig:
    shape = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_hidden_layers": 4}
    return LlamaConfig.from_hf({"model_type": model_type, "vocab_size": VOCAB, **shape, **fields})


def test_mistral_slides_on_every_layer_and_keeps_its_whole_context() -> None:
    cfg = _config("mistral", sliding_window=16, max_position_embeddings=4096)
    assert [cfg.window_of(i) for i in range(4)] == [16, 16, 16, 16]
    assert cfg.max_position_embeddings == 4096  # the window slides; it is no context limit


def test_qwen2_slides_from_max_window_layers_on_when_use_sliding_window_is_set() -> None:
    cfg = _config("qwen2", sliding_window=16, use_sliding_window=True, max_window_layers=2)
    assert [cfg.window_of(i) for i in range(4)] == [0, 0, 16, 16]


def test_qwen_layer_types_name_the_sliding_layers() -> None:
    kinds = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    cfg = _config("qwen3", sliding_window=8, use_sliding_window=True, layer_types=kinds)
    assert [cfg.window_of(i) for i in range(4)] == [8, 0, 8, 0]


def test_qwen_without_use_sliding_window_attends_to_the_whole_context() -> None:
    cfg = _config("qwen2", sliding_window=16, max_window_layers=0)
    assert cfg.sliding_window is None and [cfg.window_of(i) for i in range(4)] == [0, 0, 0, 0]


def test_a_window_that_is_not_a_positive_whole_number_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"config\.json: sliding_window -4 must be a whole number of tokens >= 1"
    ):
        _config("mistral", sliding_window=-4)


# ---- the engine against transformers, past the window ------------------------------------------


def _reference(out: Path, model_type: str, seed: int, **fields: Any) -> Reference:
    """Prompts of 40..100 tokens, and transformers' greedy outputs, one prompt at a time, fp32."""
    model_dir = write_checkpoint(out, model_type, seed, **fields)
    rng = random.Random(seed)
    prompts = [[rng.randrange(8, VOCAB) for _ in range(40 + 12 * i)] for i in range(6)]
    return Reference(model_dir, prompts, transformers_greedy(model_dir, prompts))


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Reference]:
    refs = {}
    for seed, (name, shape) in enumerate(SHAPES.items()):
        refs[name] = _reference(tmp_path_factory.mktemp(name), "mistral", seed=20 + seed, **shape)
    return refs


def test_every_prompt_and_output_runs_past_the_window(mistral: dict[str, Reference]) -> None:
    for name, ref in mistral.items():
        window = SHAPES[name]["sliding_window"]
        assert min(len(p) for p in ref.prompts) > window  # every prefill is longer than the window
        assert len({len(p) for p in ref.prompts}) == len(ref.prompts)


def test_the_same_weights_without_the_window_decode_otherwise(
    mistral: dict[str, Reference], tmp_path: Path
) -> None:
    # The checks below would pass as well with attention over the whole context, were it equal.
    ref = mistral["window16"]
    unwindowed = tmp_path / "unwindowed"
    unwindowed.mkdir()
    for item in ref.model_dir.iterdir():
        (unwindowed / item.name).symlink_to(item)
    (unwindowed / "config.json").unlink()
    config = json.loads((ref.model_dir / "config.json").read_text())
    (unwindowed / "config.json").write_text(json.dumps({**config, "sliding_window": None}))
    engine = LLMEngine(unwindowed, max_batch_size=8)
    outputs = engine.generate(ref.prompts, GREEDY)
    assert sum(got != want for got, want in zip(outputs, ref.outputs, strict=True)) >= len(ref.outputs) // 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_mistral_greedy_equals_transformers_past_its_window(
    shape: str, backend: str, mistral: dict[str, Reference]
) -> None:
    ref = mistral[shape]
    engine = LLMEngine(ref.model_dir, max_batch_size=8, attention_backend=backend)
    assert engine.generate(ref.prompts, GREEDY) == ref.outputs


def test_mistral_equals_transformers_when_prompts_prefill_in_chunks_smaller_than_the_window(
    mistral: dict[str, Reference],
) -> None:
    # 16 tokens a step against a 32-token window: each chunk attends over a cached prefix it slides along.
    ref = mistral["window32"]
    engine = LLMEngine(ref.model_dir, max_batch_size=8, max_num_batched_tokens=16)
    assert engine.generate(ref.prompts, GREEDY) == ref.outputs
    assert engine.stats().last_step_tokens <= 16


@pytest.mark.parametrize("backend", BACKENDS)
def test_mistral_equals_transformers_on_prefix_cache_hits(
    backend: str, mistral: dict[str, Reference]
) -> None:
    ref = mistral["window16"]
    engine = LLMEngine(ref.model_dir, block_size=4, attention_backend=backend)
    first = engine.generate(ref.prompts, GREEDY)
    again = engine.generate(ref.prompts, GREEDY)  # every prompt's full blocks are cached now
    assert first == ref.outputs and again == ref.outputs
    assert engine.stats().prefix_cache_hits > 0


@pytest.mark.slow
def test_the_triton_kernel_in_the_engine_equals_transformers_past_the_window(
    mistral: dict[str, Reference],
) -> None:
    # Under Triton's interpreter (conftest): the two longest prompts only, in 32-token chunks.
    ref = mistral["window16"]
    engine = LLMEngine(ref.model_dir, attention_backend="triton", max_num_batched_tokens=32)
    assert engine.generate(ref.prompts[-2:], GREEDY) == ref.outputs[-2:]


def test_a_long_sequence_holds_only_the_blocks_of_its_window(mistral: dict[str, Reference]) -> None:
    # Every layer slides: blocks wholly behind every later query's window go back to the pool.
    ref = mistral["window16"]
    engine = LLMEngine(ref.model_dir, block_size=4, max_batch_size=8)
    bm = engine.block_manager
    for i, prompt in enumerate(ref.prompts):
        engine.add_request(str(i), prompt, GREEDY)
    got: dict[str, list[int]] = {str(i): [] for i in range(len(ref.prompts))}
    most_held = 0
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id].extend(out.new_token_ids)
        for seq in engine.scheduler.running:
            most_held = max(most_held, len(seq.block_table) - seq.num_released_blocks)
    longest = max(len(p) for p in ref.prompts) + MAX_NEW
    assert most_held <= 16 // 4 + 2 < bm.blocks_for(longest)
    assert [got[str(i)] for i in range(len(ref.prompts))] == ref.outputs
    assert bm.num_free_blocks == bm.num_blocks  # every block back once every sequence is done


def test_mistral_equals_transformers_when_sequences_freeing_blocks_are_preempted(
    mistral: dict[str, Reference],
) -> None:
    # 32 blocks of 4 tokens: eight sequences of ~10 blocks each (a 32-token window) do not fit.
    ref = mistral["window32"]
    engine = LLMEngine(
        ref.model_dir,
        max_batch_size=8,
        block_size=4,
        num_blocks=32,
        max_seq_len=128,
        max_num_batched_tokens=16,
    )
    shared = [ref.prompts[5]] * 2  # identical prompts: later ones hit the first one's blocks
    assert engine.generate(ref.prompts + shared, GREEDY) == ref.outputs + [ref.outputs[5]] * 2
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert stats.kv_blocks_free == stats.kv_blocks_total


def test_blocks_stay_held_where_some_layer_sees_the_whole_context(tmp_path: Path) -> None:
    fields = {**SHAPES["window16"], "use_sliding_window": True, "max_window_layers": 1}
    model_dir = write_checkpoint(tmp_path, "qwen2", seed=31, **fields)
    engine = LLMEngine(model_dir, block_size=4)
    assert engine.block_manager.window == 0


def test_qwen2_with_sliding_and_full_layers_equals_transformers(tmp_path: Path) -> None:
    # Layer 0 attends to the whole context, layer 1 within 16 tokens (max_window_layers 1).
    fields = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
              "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}  # fmt: skip
    ref = _reference(tmp_path, "qwen2", seed=30, **fields)
    saved = json.loads((ref.model_dir / "config.json").read_text())
    assert saved["layer_types"] == ["full_attention", "sliding_attention"]
    engine = LLMEngine(ref.model_dir, max_batch_size=8)
    assert engine.generate(ref.prompts, GREEDY) == ref.outputs
