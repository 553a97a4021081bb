"""Tensor parallelism: two gloo processes (rank 0 here, rank 1 spawned) give the TP=1 outputs."""

from __future__ import annotations

import pytest
from engine_fixtures import Reference, generate_tracking_batch
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import SamplingParams


def test_tp2_over_gloo_equals_tp1_with_a_full_batch(gqa_ref: Reference) -> None:
    engine = LLMEngine(gqa_ref.model_dir, tensor_parallel_size=2, max_batch_size=8, max_num_batched_tokens=64)
    try:
        assert engine.runner.model.layers[0].self_attn.num_kv_heads == 2  # each rank holds half the KV heads
        outs, largest = generate_tracking_batch(
            engine, gqa_ref.prompts, SamplingParams(max_tokens=24, temperature=0.0)
        )
        assert largest == 8
    finally:
        engine.shutdown()
    assert outs == gqa_ref.outputs
    assert all(not p.is_alive() for p in engine.workers.processes)


def test_tp_size_that_does_not_divide_the_kv_heads_is_refused(tied_dir) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3 must divide num_attention_heads \(4\)"):
        LLMEngine(tied_dir, tensor_parallel_size=3, num_blocks=64)
