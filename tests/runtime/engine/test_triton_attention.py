"""The Triton paged-attention kernel against a plain per-sequence softmax over the gathered keys."""

from __future__ import annotations

import os

# Triton decides between compiling and interpreting when a kernel is defined, reading this once on
# its first import: set before anything imports triton so the kernel runs on CPU tensors here.
os.environ.setdefault("TRITON_INTERPRET", "1")

import random  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from frontier_runtime.ops import triton_attention  # noqa: E402

FP8 = torch.float8_e4m3fn
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}


@dataclass
class Step:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    tables: torch.Tensor
    rows: torch.Tensor
    query_start: torch.Tensor
    seq_lens: torch.Tensor
    query_lens: list[int]
    lens: list[int]
    block_tables: list[list[int]]
    scale: float

    def run(self, **kw: object) -> torch.Tensor:
        return triton_attention.paged_attention(
            self.q,
            self.k_cache,
            self.v_cache,
            self.tables,
            self.rows,
            self.query_start,
            self.seq_lens,
            max(self.query_lens),
            self.scale,
            **kw,  # type: ignore[arg-type]
        )


def _step(
    seed: int,
    query_lens: list[int],
    lens: list[int],
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    cache_dtype: torch.dtype | None = None,
    spare_rows: int = 2,
    num_blocks: int = 0,
    width: int = 0,
) -> Step:
    """Blocks drawn as a random permutation of the pool, sequences on random rows of the table."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lens]
    num_blocks = num_blocks or sum(need) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    block_tables, used = [], 0
    for n in need:
        block_tables.append(perm[used : used + n])
        used += n
    width = width or max(need) + 1
    num_rows = len(lens) + spare_rows
    rows = torch.randperm(num_rows, generator=gen)[: len(lens)].to(torch.int32)
    # Unused entries point at real blocks: the kernel must never read past a sequence's length.
    tables = torch.randint(0, num_blocks, (num_rows, width), generator=gen, dtype=torch.int32)
    for r, t in zip(rows.tolist(), block_tables, strict=True):
        tables[r, : len(t)] = torch.tensor(t, dtype=torch.int32)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    if cache_dtype is not None:
        k_cache, v_cache = (k_cache.float() / 0.05).to(cache_dtype), (v_cache.float() / 0.05).to(cache_dtype)
    q = torch.randn(sum(query_lens), heads, head_dim, generator=gen).to(dtype)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    return Step(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        tables=tables,
        rows=rows,
        query_start=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        query_lens=query_lens,
        lens=lens,
        block_tables=block_tables,
        scale=head_dim**-0.5,
    )


def _reference(step: Step, k_scale: float = 1.0, v_scale: float = 1.0, window: int = 0) -> torch.Tensor:
    """Each sequence alone: its keys gathered by position, explicit causal softmax in float32;
    ``window`` > 0 masks as transformers' sliding window does (``kv_idx > q_idx - window``)."""
    heads = step.q.shape[1]
    block_size, kv_heads = step.k_cache.shape[1], step.k_cache.shape[2]
    out, t0 = [], 0
    for n, total, table in zip(step.query_lens, step.lens, step.block_tables, strict=True):
        pos = torch.arange(total)
        blocks = torch.tensor(table)[pos // block_size]
        k = _gather(step.k_cache, blocks, pos % block_size) * k_scale  # [total, kv_heads, hd]
        v = _gather(step.v_cache, blocks, pos % block_size) * v_scale
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
        q = step.q[t0 : t0 + n].float()
        scores = torch.einsum("qhd,khd->hqk", q, k) * step.scale
        q_pos = torch.arange(total - n, total).unsqueeze(1)
        visible = pos.unsqueeze(0) <= q_pos
        if window:
            visible &= pos.unsqueeze(0) > q_pos - window
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out.append(torch.einsum("hqk,khd->qhd", probs, v))
        t0 += n
    return torch.cat(out)


def _gather(cache: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    if cache.dtype == FP8:  # gathered as bytes: CPU indexing has no fp8 kernel
        return cache.view(torch.uint8)[blocks, offsets].view(FP8).float()
    return cache[blocks, offsets].float()


def _check(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    tol = TOLERANCE[got.dtype]
    err = (got.float() - want).abs().max().item()
    assert err <= tol * (1 + want.abs().max().item()), f"{what}: max error {err:.3g}"


def _random_case(seed: int) -> dict[str, object]:
    """A step of 1..6 sequences mixing decodes and prefill chunks over a cached prefix."""
    rng = random.Random(seed)
    kv_heads = rng.choice([1, 2])
    group = [1, 4, 8][seed % 3]
    block_size = [16, 32][(seed // 3) % 2]
    query_lens, lens = [], []
    for _ in range(rng.randint(1, 6)):
        # Chunks up to 80 tokens span several query tiles, whatever the group size.
        n = 1 if rng.random() < 0.5 else rng.randint(2, 80)
        query_lens.append(n)
        lens.append(n + rng.randint(0, 3 * block_size))  # the cached prefix may be empty
    return {
        "query_lens": query_lens,
        "lens": lens,
        "heads": kv_heads * group,
        "kv_heads": kv_heads,
        "head_dim": 64 if seed % 4 else 80,
        "block_size": block_size,
        "dtype": torch.float32 if seed % 2 else torch.bfloat16,
    }


@pytest.mark.parametrize("seed", range(24))
@pytest.mark.slow
def test_random_steps_match_the_reference(seed: int) -> None:
    case = _random_case(seed)
    step = _step(seed, **case)  # type: ignore[arg-type]
    _check(step.run(), _reference(step), f"seed {seed}: {case}")


def test_fp8_cache_matches_its_dequantised_values() -> None:
    step = _step(7, [1, 9, 1], [20, 40, 33], 8, 2, 64, 16, torch.bfloat16, cache_dtype=FP8)
    got = step.run(k_scale=0.05, v_scale=0.05)
    _check(got, _reference(step, 0.05, 0.05), "fp8 cache")


def test_decode_only_step_with_gqa() -> None:
    step = _step(11, [1, 1, 1, 1], [1, 17, 64, 45], 8, 1, 64, 32, torch.float32)
    _check(step.run(), _reference(step), "decode step")


def test_query_read_through_its_strides_from_a_fused_qkv_view() -> None:
    step = _step(12, [1, 6, 3], [10, 30, 3], 4, 2, 64, 16, torch.float32)
    qkv = torch.randn(step.q.shape[0], 8, 64)
    qkv[:, :4] = step.q
    step.q = qkv[:, :4]
    assert not step.q.is_contiguous()
    _check(step.run(), _reference(step), "strided q")


def test_out_is_written_in_place() -> None:
    step = _step(13, [1, 5], [9, 21], 4, 1, 64, 16, torch.float32)
    out = torch.full_like(step.q, float("nan"))
    got = step.run(out=out)
    assert got.data_ptr() == out.data_ptr()
    _check(out, _reference(step), "out=")


def test_same_shapes_with_new_contents_give_new_answers() -> None:
    """What a graph replay does: same tensors, lengths and tables rewritten in place."""
    shapes = {"num_blocks": 12, "width": 4}
    first = _step(14, [1, 1, 1], [5, 40, 18], 4, 1, 64, 16, torch.float32, **shapes)
    second = _step(15, [1, 1, 1], [33, 2, 47], 4, 1, 64, 16, torch.float32, **shapes)
    _check(first.run(), _reference(first), "first contents")
    for name in ("q", "k_cache", "v_cache", "tables", "rows", "seq_lens"):
        getattr(first, name).copy_(getattr(second, name))
    _check(first.run(), _reference(second), "rewritten contents")


# (query_lens, seq_lens, window): decodes whose window starts inside a key tile and a page, prefill
# chunks longer than the window (rows that see no key of the first tiles), a window of one key, a
# window wider than every sequence, GQA groups of 1, 4 and 8.
WINDOWED = [
    ([1, 1, 1], [130, 17, 64], 16, 4, 1, 16),
    ([1, 40, 7], [100, 40, 90], 5, 8, 2, 16),
    ([80, 1], [200, 150], 33, 8, 1, 32),
    ([9, 1], [9, 70], 1, 4, 4, 16),
    ([12, 3], [60, 30], 500, 4, 1, 16),
]


@pytest.mark.parametrize(("query_lens", "lens", "window", "heads", "kv_heads", "block_size"), WINDOWED)
def test_a_sliding_window_limits_each_query_to_its_last_keys(
    query_lens: list[int], lens: list[int], window: int, heads: int, kv_heads: int, block_size: int
) -> None:
    step = _step(21, query_lens, lens, heads, kv_heads, 64, block_size, torch.float32)
    _check(step.run(window=window), _reference(step, window=window), f"window {window}")


def test_a_sliding_window_over_a_bfloat16_fp8_cache() -> None:
    step = _step(22, [1, 30], [90, 75], 8, 2, 64, 16, torch.bfloat16, cache_dtype=FP8)
    got = step.run(k_scale=0.05, v_scale=0.05, window=20)
    _check(got, _reference(step, 0.05, 0.05, window=20), "fp8 cache, window 20")
