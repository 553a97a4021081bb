"""Sampling per request: seeds, top-k/top-p, stop strings, stop tokens, max_tokens, logprobs."""

from __future__ import annotations

import pytest
from engine_fixtures import Reference, generate_tracking_batch, random_fillers
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import RequestOutput, SamplingParams


def _collect(engine: LLMEngine) -> dict[str, list[RequestOutput]]:
    got: dict[str, list[RequestOutput]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            got.setdefault(out.request_id, []).append(out)
    return got


def _tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def _text(outs: list[RequestOutput]) -> str:
    return "".join(o.new_text for o in outs)


@pytest.fixture(scope="module")
def engine(gqa_dir) -> LLMEngine:  # noqa: ANN001
    return LLMEngine(gqa_dir, max_batch_size=8)


def test_a_seeded_request_samples_the_same_tokens_alone_or_in_a_full_batch(engine: LLMEngine) -> None:
    prompt = engine.tokenizer.encode("Seeded sampling should not care about its neighbours")
    params = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=1234)
    alone = engine.generate([prompt], params)[0]

    fillers = random_fillers(7, seed=11)
    filler_params = [
        SamplingParams(max_tokens=30, temperature=0.8, seed=i if i % 2 else None) for i in range(7)
    ]
    batch = fillers[:3] + [prompt] + fillers[3:]
    outs, largest = generate_tracking_batch(engine, batch, filler_params[:3] + [params] + filler_params[3:])
    assert outs[3] == alone
    assert largest == 8


def test_different_seeds_draw_different_tokens(engine: LLMEngine) -> None:
    prompt = engine.tokenizer.encode("Different seeds")
    a = engine.generate([prompt], SamplingParams(max_tokens=16, temperature=1.0, seed=1))[0]
    b = engine.generate([prompt], SamplingParams(max_tokens=16, temperature=1.0, seed=2))[0]
    assert a != b


def test_top_k_of_one_is_greedy(engine: LLMEngine, gqa_ref: Reference) -> None:
    params = SamplingParams(max_tokens=24, temperature=1.5, top_k=1)
    assert engine.generate(gqa_ref.prompts[:3], params) == gqa_ref.outputs[:3]


def test_a_tiny_top_p_keeps_only_the_most_likely_token(engine: LLMEngine, gqa_ref: Reference) -> None:
    params = SamplingParams(max_tokens=24, temperature=1.0, top_p=1e-6)
    assert engine.generate(gqa_ref.prompts[:3], params) == gqa_ref.outputs[:3]


def test_a_stop_string_ends_the_text_before_it_and_never_streams_any_part_of_it(
    engine: LLMEngine, gqa_ref: Reference
) -> None:
    full = engine.tokenizer.decode(gqa_ref.outputs[2])
    stop = full[len(full) // 2 : len(full) // 2 + 4]
    engine.add_request("s", gqa_ref.prompts[2], SamplingParams(max_tokens=24, temperature=0.0, stop=(stop,)))
    outs = _collect(engine)["s"]
    assert outs[-1].finish_reason == "stop"
    # The deltas only ever append: their sum being the truncated text means none carried the stop string.
    assert _text(outs) == full[: full.index(stop)]


def test_a_stop_token_id_ends_the_request_with_that_token(engine: LLMEngine, gqa_ref: Reference) -> None:
    ref = gqa_ref.outputs[5]
    stop_id = ref[6]
    engine.add_request(
        "t", gqa_ref.prompts[5], SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(stop_id,))
    )
    outs = _collect(engine)["t"]
    assert _tokens(outs) == ref[: ref.index(stop_id) + 1]
    assert outs[-1].finished and outs[-1].finish_reason == "stop"


def test_max_tokens_ends_the_request_with_reason_length(engine: LLMEngine, gqa_ref: Reference) -> None:
    engine.add_request("m", gqa_ref.prompts[1], SamplingParams(max_tokens=5, temperature=0.0))
    outs = _collect(engine)["m"]
    assert _tokens(outs) == gqa_ref.outputs[1][:5]
    assert [o.finished for o in outs] == [False] * 4 + [True]
    assert outs[-1].finish_reason == "length" and outs[-1].completion_tokens == 5
    assert outs[-1].prompt_tokens == len(gqa_ref.prompts[1])


def test_logprobs_report_the_chosen_token_and_the_top_alternatives(
    engine: LLMEngine, gqa_ref: Reference
) -> None:
    engine.add_request("l", gqa_ref.prompts[0], SamplingParams(max_tokens=4, temperature=0.0, logprobs=3))
    outs = _collect(engine)["l"]
    for out in outs:
        (lp,) = out.logprobs
        assert lp.token_id == out.new_token_ids[0]
        assert len(lp.top) == 3
        assert max(lp.top, key=lp.top.get) == lp.token_id  # greedy picks the most likely token
        assert lp.logprob == pytest.approx(lp.top[lp.token_id]) and lp.logprob <= 0.0


def test_without_logprobs_requested_none_are_returned(engine: LLMEngine, gqa_ref: Reference) -> None:
    engine.add_request("n", gqa_ref.prompts[0], SamplingParams(max_tokens=2, temperature=0.0))
    assert all(o.logprobs is None for o in _collect(engine)["n"])
