"""What every attention backend is: its static facts (``ops.table``), its KV cache, and the calls a
decoder layer makes each step (write the step's keys and values, attend), over one step's metadata.

A backend is a class, never instantiated: it holds no state, and the metadata of a step names the
class that reads it, so a layer calls ``meta.backend.attend(...)`` without knowing which it is. This
base is FlashAttention's paged layout, which every backend but the CPU kernel reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from frontier_runtime.ops import table, triton_fused

# torch's dtypes as ``ops.table`` names them (fp8 as ``runtime.kv_cache_dtype`` spells it).
DTYPE_NAMES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float8_e4m3fn: table.FP8,
}
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


@dataclass
class GatherGroup:
    """The sdpa-gather backend's plan, kept on the step's metadata: one SDPA call's worth of a step (its decodes, or its prefill chunks): which cache blocks
    to gather, where each padded query row comes from, which rows are real, and the mask."""

    t0: int  # the group's tokens are q[t0:t1]
    t1: int
    seqs: int
    max_q: int
    blocks: torch.Tensor  # [seqs * nblocks] long: cache blocks, sequence by sequence
    query_src: torch.Tensor  # [seqs * max_q] long: token of q each padded query row reads
    real_rows: torch.Tensor  # [t1 - t0] long: the padded rows that are real tokens, in order
    mask: torch.Tensor  # [seqs, 1, group * max_q, nblocks * block_size] bool


@dataclass
class AttentionMetadata:
    """Where this step's K/V go and what each query reads; built once per step, used by every layer."""

    slots: torch.Tensor  # [num_tokens] int64: cache slot each token's K/V is written to
    tables: torch.Tensor  # [num_rows, max_blocks] int32: every live sequence's block table
    rows: torch.Tensor  # [num_seqs] int32: each sequence's row of ``tables``
    query_start: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    num_decodes: int  # the first sequences, one query token each
    max_query_len: int
    max_seq_len: int
    backend: type[AttentionBackend]
    # flash-varlen: the step's own rows of the table, and cumulative key counts.
    step_tables: torch.Tensor | None = None
    cu_seq_k: torch.Tensor | None = None
    # sdpa-gather: host copies of the lengths, for padding, and the plan the first layer of each
    # window (0: none) builds.
    host_query_lens: list[int] | None = None
    host_seq_lens: list[int] | None = None
    gather: dict[int, list[GatherGroup]] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class AttentionCall:
    """One layer's ``attend``, its arguments checked: what a backend's ``forward`` reads. ``k_scale``
    and ``v_scale`` are 1.0 unless the cache is fp8; ``window`` is >= 0."""

    q: torch.Tensor  # [tokens, heads, head_dim]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    meta: AttentionMetadata
    scale: float
    k_scale: float = 1.0
    v_scale: float = 1.0
    window: int = 0

    def paged_cache(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """What the paged kernels (the C++ and the Triton one) take after the query, in their order:
        the K and V cache, the block tables and each sequence's row of them, the query starts and
        the sequence lengths."""
        meta = self.meta
        return (self.k_cache, self.v_cache, meta.tables, meta.rows, meta.query_start, meta.seq_lens)


@dataclass(frozen=True)
class RotaryWrite:
    """One layer's fused rotary and cache write: q rotated in place, rotated k and v written at
    ``slots``. ``k_scale``/``v_scale`` apply to an fp8 cache only (it holds value / scale)."""

    q: torch.Tensor  # [tokens, heads, head_dim]
    k: torch.Tensor  # [tokens, kv_heads, head_dim]
    v: torch.Tensor
    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slots: torch.Tensor
    k_scale: float = 1.0
    v_scale: float = 1.0


class AttentionBackend:
    """One way a step's queries read the paged KV cache. Subclasses set ``traits`` and ``forward``."""

    traits: ClassVar[table.AttentionTraits]
    name: ClassVar[str]  # the ``attention_backend`` setting that requires it
    # Selection runs a tiny step through it and compares with SDPA before choosing it (a kernel
    # whose support depends on this torch, this GPU or this block size).
    verified_on_a_probe_step: ClassVar[bool] = False

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls.name = cls.traits.name

    # -- whether it runs here --------------------------------------------------------------------

    @classmethod
    def unavailable(cls, device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype) -> str:
        """Why it cannot run on ``device`` for a ``dtype`` model with a ``kv_dtype`` cache ("" if it
        can), from its traits and what this host has, without running it."""
        problem = cls.traits.problem(device.type, DTYPE_NAMES.get(kv_dtype, str(kv_dtype)))
        if problem:
            return f"it {problem}"
        if DTYPE_NAMES.get(dtype) not in cls.traits.dtypes:
            return f"it computes in {' or '.join(cls.traits.dtypes)} only, not {dtype}"
        return ""

    @classmethod
    def available(cls, device: torch.device | str) -> bool:
        """Whether it runs on ``device`` at all (for some model and cache dtype)."""
        device = torch.device(device)
        return any(
            not cls.unavailable(device, dtype, dtype)
            for dtype, name in DTYPE_NAMES.items()
            if name in cls.traits.dtypes
        )

    # -- the KV cache ----------------------------------------------------------------------------

    @classmethod
    def allocate_kv(
        cls,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V cache in this backend's layout, zeroed (padded reads must not be NaN)."""
        sizes = {"blocks": num_blocks, "block_size": block_size, "kv_heads": kv_heads, "head_dim": head_dim}
        return (
            torch.zeros([sizes[axis] for axis in cls.traits.k_layout], dtype=dtype, device=device),
            torch.zeros([sizes[axis] for axis in cls.traits.v_layout], dtype=dtype, device=device),
        )

    @classmethod
    def write_kv(
        cls,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> None:
        """Store the step's keys and values ([tokens, kv_heads, head_dim]) at their slots."""
        k, v, k_cache, v_cache = _as_cache_values(k_cache, v_cache, k, v, k_scale, v_scale)
        cls.store_kv(k_cache, v_cache, k, v, meta.slots)

    @classmethod
    def store_kv(cls, k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slots: Tensor) -> None:
        """``write_kv``'s store, k and v already as the cache holds them: this backend's layout."""
        kvh, hd = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, kvh, hd).index_copy_(0, slots, k)
        v_cache.view(-1, kvh, hd).index_copy_(0, slots, v)

    @classmethod
    def can_rotate_into_cache(cls, q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        """Whether ``rotary_and_cache`` applies: where ``triton_fused`` runs, a cache of q's dtype or fp8."""
        return triton_fused.applies(q) and k_cache.dtype in (q.dtype, triton_fused.FP8)

    @classmethod
    def rotary_and_cache(cls, w: RotaryWrite) -> None:
        """Rotate ``w.q`` in place and write rotated k and v at ``w.slots`` of the cache, in one pass."""
        triton_fused.rotary_and_write_kv(
            w.q, w.k, w.v, w.positions, w.cos, w.sin, w.k_cache, w.v_cache, w.slots, w.k_scale, w.v_scale
        )

    # -- a step ----------------------------------------------------------------------------------

    @classmethod
    def complete_metadata(cls, meta: AttentionMetadata, query_lens: list[int], seq_lens: list[int]) -> None:
        """Add what this backend reads beyond the common fields; ``query_lens`` and ``seq_lens`` are
        the host's copies of the step's lengths. The base reads nothing more."""

    @classmethod
    def attend(
        cls,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        window: int = 0,
    ) -> torch.Tensor:
        """Attention output for ``q`` ([tokens, heads, head_dim]), same shape and dtype.

        ``k_scale``/``v_scale`` apply to an fp8 cache only (it holds value / scale). ``window`` > 0:
        each query sees its last ``window`` keys only (a sliding window); 0: every earlier key."""
        if window < 0:
            raise ValueError(f"attention window {window} must be >= 0 (0: no window)")
        if k_cache.dtype != FP8:
            k_scale = v_scale = 1.0
        return cls.forward(AttentionCall(q, k_cache, v_cache, meta, scale, k_scale, v_scale, window))

    @classmethod
    def forward(cls, call: AttentionCall) -> torch.Tensor:
        """``attend`` once its arguments are checked: the backend's own kernel."""
        raise NotImplementedError(f"{cls.__name__} has no forward")


def _as_cache_values(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: float,
    v_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """k and v as the cache stores them, and the caches to write them into. An fp8 cache holds
    value / scale (per tensor), written as bytes: index_copy_ has no fp8 kernel."""
    if k_cache.dtype == FP8:
        k = (k.float() / k_scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8).view(torch.uint8)
        v = (v.float() / v_scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8).view(torch.uint8)
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    return k.to(k_cache.dtype), v.to(v_cache.dtype), k_cache, v_cache
