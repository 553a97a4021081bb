"""``flash-varlen``: on CUDA, torch's ``varlen_attn`` with ``block_table`` (FlashAttention's paged varlen
kernel; GQA native), when this torch's signature has what it needs and the kernel accepts this block
size (probed once; FlashAttention-2 wants pages of 256 tokens). It reads no fp8 cache."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from frontier_runtime.ops import table
from frontier_runtime.ops.attention.base import AttentionBackend, AttentionCall, AttentionMetadata


class FlashVarlenBackend(AttentionBackend):
    traits = table.ATTENTION_BACKENDS["flash-varlen"]
    verified_on_a_probe_step = True

    @classmethod
    def complete_metadata(cls, meta: AttentionMetadata, query_lens: list[int], seq_lens: list[int]) -> None:
        """The step's own rows of the table, and cumulative key counts, on the device."""
        meta.step_tables = meta.tables.index_select(0, meta.rows)
        cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int32, device=meta.seq_lens.device)
        torch.cumsum(meta.seq_lens, 0, out=cu[1:])
        meta.cu_seq_k = cu

    @classmethod
    def forward(cls, call: AttentionCall) -> torch.Tensor:
        varlen_attn, params = varlen_entry()
        meta = call.meta
        # One query per sequence (a decode step) sees every key: no causal window, which lets the
        # kernel pack a KV head's query heads into one tile.
        gqa = call.q.shape[1] != call.k_cache.shape[2]
        kw = varlen_keywords(params, causal=meta.max_query_len > 1, gqa=gqa, window=call.window)
        out = varlen_attn(
            call.q,
            call.k_cache,
            call.v_cache,
            meta.query_start,
            meta.cu_seq_k,
            meta.max_query_len,
            meta.max_seq_len,
            scale=call.scale,
            seqused_k=meta.seq_lens,
            block_table=meta.step_tables,
            **kw,
        )
        assert isinstance(out, torch.Tensor)
        return out


@functools.cache
def varlen_entry() -> tuple[Callable[..., Any], frozenset[str]]:
    """torch's paged varlen attention and the keywords this torch's version of it takes."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def varlen_keywords(params: frozenset[str], causal: bool, gqa: bool, window: int = 0) -> dict[str, Any]:
    """The keywords for this torch's ``varlen_attn``, or NotImplementedError naming what it lacks.

    Its signature has moved between torch releases (``is_causal`` became ``window_size``;
    ``enable_gqa``, ``seqused_k`` and ``block_table`` came later), so they are read off it."""
    missing = {"seqused_k", "block_table", "scale"} - params
    if gqa and "enable_gqa" not in params:
        missing.add("enable_gqa")
    if not ({"window_size", "is_causal"} & params) or (window and "window_size" not in params):
        missing.add("window_size")
    if missing:
        raise NotImplementedError(f"this torch's varlen_attn takes no {', '.join(sorted(missing))}")
    kw: dict[str, Any] = {}
    if window:
        # FlashAttention's (left, right) window, aligned to the end of the keys like its causal
        # mask: key j is seen by the query at position p when p - left <= j <= p.
        kw["window_size"] = (window - 1, 0)
    elif "window_size" in params:
        kw["window_size"] = (-1, 0) if causal else (-1, -1)
    else:
        kw["is_causal"] = causal
    if gqa:
        kw["enable_gqa"] = True
    return kw
