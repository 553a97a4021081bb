"""Scheduling: continuous batching, chunked prefill beside decodes, FCFS, aborts, limits."""

from __future__ import annotations

import pytest
from engine_fixtures import Reference
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


def test_abort_at_any_point_frees_every_block(tied_ref: Reference) -> None:
    engine = LLMEngine(tied_ref.model_dir, max_batch_size=4, max_num_batched_tokens=16, block_size=4)
    for i, p in enumerate(tied_ref.prompts):
        engine.add_request(str(i), p, GREEDY)
    engine.step()  # some prefilling (chunked), most still waiting
    engine.step()
    states = {s.status.value for s in engine._seqs.values()}
    assert states == {"running", "waiting"}
    for _ in range(4):
        engine.step()
    aborted = [str(i) for i in range(len(tied_ref.prompts))]
    for rid in aborted:
        assert engine.abort(rid)
    outs = engine.step()
    assert sorted(o.request_id for o in outs if o.finish_reason == "abort") == sorted(aborted)
    stats = engine.stats()
    assert stats.kv_blocks_free == stats.kv_blocks_total
    assert stats.running == 0 and stats.waiting == 0 and not engine.has_unfinished()
    assert all(rc == 0 for rc in engine.block_manager.ref_counts)


def test_aborting_an_unknown_or_finished_request_is_a_no_op(tied_ref: Reference) -> None:
    engine = LLMEngine(tied_ref.model_dir)
    engine.generate([tied_ref.prompts[0]], SamplingParams(max_tokens=2, temperature=0.0))
    assert engine.abort("never-seen") is False
    assert engine.step() == []


def test_new_requests_join_a_running_batch_between_steps(tied_ref: Reference) -> None:
    engine = LLMEngine(tied_ref.model_dir, max_batch_size=8)
    engine.add_request("a", tied_ref.prompts[0], GREEDY)
    engine.step()
    engine.step()
    engine.add_request("b", tied_ref.prompts[1], GREEDY)
    outs = engine.step()
    assert {o.request_id for o in outs} == {"a", "b"}
    assert engine.stats().last_batch_size == 2


def test_a_long_prompt_is_prefilled_in_chunks_while_others_keep_decoding(tied_ref: Reference) -> None:
    engine = LLMEngine(tied_ref.model_dir, max_batch_size=8, max_num_batched_tokens=16)
    engine.add_request("short", tied_ref.prompts[0], GREEDY)
    engine.step()
    long_prompt = tied_ref.prompts[5]  # ~60 tokens: four chunks or so at 16 tokens a step
    engine.add_request("long", long_prompt, GREEDY)
    steps_until_long_starts = 0
    while True:
        outs = {o.request_id for o in engine.step()}
        assert "short" in outs  # the decode is never stalled by the prefill
        if "long" in outs:
            break
        steps_until_long_starts += 1
    assert steps_until_long_starts >= len(long_prompt) // 16 - 1


def test_requests_are_served_first_come_first_served(tied_ref: Reference) -> None:
    engine = LLMEngine(tied_ref.model_dir, max_batch_size=1)
    for i in range(4):
        engine.add_request(str(i), tied_ref.prompts[i], SamplingParams(max_tokens=3, temperature=0.0))
    order = []
    while engine.has_unfinished():
        order += [o.request_id for o in engine.step() if o.finished]
    assert order == ["0", "1", "2", "3"]


def test_max_batch_size_caps_the_sequences_of_a_step(tied_ref: Reference) -> None:
    engine = LLMEngine(tied_ref.model_dir, max_batch_size=3)
    for i, p in enumerate(tied_ref.prompts):
        engine.add_request(str(i), p, GREEDY)
    sizes = []
    while engine.has_unfinished():
        engine.step()
        sizes.append(engine.stats().last_batch_size)
    assert max(sizes) == 3


def test_a_prompt_that_can_never_be_scheduled_finishes_instead_of_hanging(tied_ref: Reference) -> None:
    # Without chunked prefill a 60-token prompt never fits a 16-token step budget.
    engine = LLMEngine(tied_ref.model_dir, max_num_batched_tokens=16, chunked_prefill=False)
    engine.add_request("big", tied_ref.prompts[5], GREEDY)
    engine.add_request("small", tied_ref.prompts[0], GREEDY)
    finished = {}
    for _ in range(100):
        for o in engine.step():
            if o.finished:
                finished[o.request_id] = o
        if not engine.has_unfinished():
            break
    assert finished["big"].finish_reason == "length" and finished["big"].completion_tokens == 0
    assert finished["small"].completion_tokens > 0
    assert engine.stats().kv_blocks_free == engine.stats().kv_blocks_total


def test_a_sequence_stops_at_the_context_length(tied_ref: Reference) -> None:
    engine = LLMEngine(tied_ref.model_dir, max_seq_len=32, num_blocks=2, block_size=16)
    prompt = tied_ref.prompts[4][:28]
    engine.add_request("c", prompt, SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert outs[-1].finish_reason == "length" and outs[-1].completion_tokens == 32 - len(prompt)


def test_start_is_refused_when_max_seq_len_cannot_fit_the_kv_cache(tied_dir) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=r"max_seq_len 512 needs 32 KV blocks .* holds 4 blocks"):
        LLMEngine(tied_dir, max_seq_len=512, num_blocks=4)


def test_start_is_refused_when_max_seq_len_exceeds_the_model_positions(tied_dir) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="max_position_embeddings"):
        LLMEngine(tied_dir, max_seq_len=4096)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "at least one token"),
        ([5] * 600, "context is 512 tokens"),
        ([5, 99999], "outside the vocabulary"),
    ],
)
def test_bad_requests_are_refused_with_a_clear_error(tied_dir, prompt: list[int], message: str) -> None:  # noqa: ANN001
    engine = LLMEngine(tied_dir, num_blocks=64)
    with pytest.raises(ValueError, match=message):
        engine.add_request("r", prompt, GREEDY)
    assert not engine.has_unfinished()


def test_a_duplicate_request_id_is_refused(tied_dir) -> None:  # noqa: ANN001
    engine = LLMEngine(tied_dir, num_blocks=64)
    engine.add_request("r", [1, 2, 3], GREEDY)
    with pytest.raises(ValueError, match="already in the engine"):
        engine.add_request("r", [1, 2, 3], GREEDY)


def test_stats_count_prompt_tokens_queried_and_hit_in_the_prefix_cache(tied_ref: Reference) -> None:
    engine = LLMEngine(tied_ref.model_dir, block_size=4)
    prompt = tied_ref.prompts[5]
    engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
    engine.add_request("again", prompt, SamplingParams(max_tokens=1, temperature=0.0))
    (out,) = engine.step()
    stats = engine.stats()
    assert out.cached_prompt_tokens == (len(prompt) - 1) // 4 * 4
    assert stats.prefix_cache_queries == 2 * len(prompt)
    assert stats.prefix_cache_hits == out.cached_prompt_tokens
