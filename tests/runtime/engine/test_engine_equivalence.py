"""Greedy outputs equal Hugging Face transformers token for token, however the engine batches.

References come from ``LlamaForCausalLM.generate(do_sample=False)``, one prompt at a time without
padding, in fp32 (see conftest). Every engine configuration below must reproduce them exactly.
"""

from __future__ import annotations

import random

import pytest
from engine_fixtures import MAX_NEW, Reference, generate_tracking_batch, random_fillers
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import SamplingParams

GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)


def _run(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    return engine.generate(prompts, GREEDY)


@pytest.mark.parametrize("ref_name", ["gqa_ref", "tied_ref"])
def test_greedy_matches_transformers_token_for_token(ref_name: str, request: pytest.FixtureRequest) -> None:
    ref: Reference = request.getfixturevalue(ref_name)
    assert len(ref.prompts) >= 8 and len({len(p) for p in ref.prompts}) >= 8
    engine = LLMEngine(ref.model_dir, max_batch_size=1)
    assert _run(engine, ref.prompts) == ref.outputs


def test_text_equals_the_tokenizer_decoding_of_the_reference(gqa_ref: Reference) -> None:
    engine = LLMEngine(gqa_ref.model_dir)
    texts: dict[str, str] = {}
    for i, p in enumerate(gqa_ref.prompts):
        engine.add_request(str(i), p, GREEDY)
    while engine.has_unfinished():
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + out.new_text
    expected = [engine.tokenizer.decode(o) for o in gqa_ref.outputs]
    assert [texts[str(i)] for i in range(len(expected))] == expected


def test_batched_equals_unbatched_with_prompts_among_random_fillers(gqa_ref: Reference) -> None:
    fillers = random_fillers(12, seed=7)
    batch = [(p, i) for i, p in enumerate(gqa_ref.prompts)] + [(f, None) for f in fillers]
    random.Random(3).shuffle(batch)
    engine = LLMEngine(gqa_ref.model_dir, max_batch_size=20)
    outs, largest = generate_tracking_batch(engine, [p for p, _ in batch], GREEDY)
    got = {i: o for (_, i), o in zip(batch, outs, strict=True) if i is not None}
    assert [got[i] for i in range(len(gqa_ref.prompts))] == gqa_ref.outputs
    assert largest == 20


def test_equal_when_the_kv_cache_is_so_small_that_sequences_are_preempted(tied_ref: Reference) -> None:
    # 12 blocks of 16 tokens: room for a couple of sequences, not for eight at once.
    engine = LLMEngine(tied_ref.model_dir, max_batch_size=8, max_seq_len=192, num_blocks=12)
    assert _run(engine, tied_ref.prompts) == tied_ref.outputs
    stats = engine.stats()
    assert stats.num_preemptions > 0
    assert stats.kv_blocks_free == stats.kv_blocks_total


def test_equal_with_prefix_cache_hits(gqa_ref: Reference) -> None:
    engine = LLMEngine(gqa_ref.model_dir, block_size=4)
    first = _run(engine, gqa_ref.prompts)
    again = _run(engine, gqa_ref.prompts)  # every prompt's full blocks are cached now
    stats = engine.stats()
    assert first == gqa_ref.outputs and again == gqa_ref.outputs
    assert stats.prefix_cache_hits > 0


def test_equal_with_prefix_cache_off(gqa_ref: Reference) -> None:
    engine = LLMEngine(gqa_ref.model_dir, prefix_caching=False, block_size=4)
    assert _run(engine, gqa_ref.prompts) == gqa_ref.outputs
    assert _run(engine, gqa_ref.prompts) == gqa_ref.outputs
    assert engine.stats().prefix_cache_hits == 0


def test_equal_with_a_tiny_chunk_budget(gqa_ref: Reference) -> None:
    # 16 tokens a step, the smallest budget a stack may set: long prompts prefill in several chunks.
    engine = LLMEngine(gqa_ref.model_dir, max_num_batched_tokens=16, max_batch_size=8)
    assert _run(engine, gqa_ref.prompts) == gqa_ref.outputs
    assert engine.stats().last_step_tokens <= 16


def test_equal_with_chunked_prefill_preemption_and_prefix_hits_together(tied_ref: Reference) -> None:
    engine = LLMEngine(
        tied_ref.model_dir,
        max_batch_size=8,
        max_num_batched_tokens=16,
        block_size=4,
        num_blocks=40,
        max_seq_len=160,
    )
    shared = [tied_ref.prompts[5]] * 3  # identical prompts: later ones hit the first one's blocks
    outs = _run(engine, tied_ref.prompts + shared)
    assert outs == tied_ref.outputs + [tied_ref.outputs[5]] * 3
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
