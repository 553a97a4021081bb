"""A generation continued from the tokens another replica produced (a migrated stream): the same
tokens as the uninterrupted run, its earlier tokens counted against max_tokens and in usage, the
text not sent yet (and only that) sent, and a seeded sample drawn where the uninterrupted one was."""

from __future__ import annotations

import pytest
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import Continuation, RequestOutput, SamplingParams


@pytest.fixture(scope="module")
def engine(gqa_dir) -> LLMEngine:  # noqa: ANN001
    return LLMEngine(gqa_dir, max_batch_size=8)


def _run(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> list[RequestOutput]:
    engine.add_request("r", prompt, params)
    outs: list[RequestOutput] = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.request_id == "r"]
    return outs


def _continued(params: SamplingParams, generated: list[int], emitted: int = 0) -> SamplingParams:
    return SamplingParams(**{**params.__dict__, "continuation": Continuation(tuple(generated), emitted)})


@pytest.mark.parametrize("cut", [1, 9, 31])
def test_a_greedy_continuation_produces_the_uninterrupted_runs_tokens(engine: LLMEngine, cut: int) -> None:
    prompt = engine.tokenizer.encode("A generation that moves to another replica part way")
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    whole = [t for o in _run(engine, prompt, params) for t in o.new_token_ids]
    rest = _run(engine, prompt, _continued(params, whole[:cut]))
    assert whole[:cut] + [t for o in rest for t in o.new_token_ids] == whole
    assert rest[-1].finish_reason == "length"
    assert rest[-1].completion_tokens == 32  # the earlier tokens count as this request's output
    assert rest[-1].prompt_tokens == len(prompt)


def test_a_seeded_sampled_continuation_draws_what_the_uninterrupted_run_drew(engine: LLMEngine) -> None:
    prompt = engine.tokenizer.encode("Seeded draws continue where they left off")
    params = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.95, seed=77, ignore_eos=True)
    whole = [t for o in _run(engine, prompt, params) for t in o.new_token_ids]
    rest = _run(engine, prompt, _continued(params, whole[:10]))
    assert whole[:10] + [t for o in rest for t in o.new_token_ids] == whole


def test_a_continuation_sends_only_the_text_the_client_does_not_have(engine: LLMEngine) -> None:
    prompt = engine.tokenizer.encode("Text across the cut, with a stop string held back")
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop=("zzzzzzzz",))
    whole = _run(engine, prompt, params)
    tokens = [t for o in whole for t in o.new_token_ids]
    cut = 12
    sent = "".join(o.new_text for o in whole[:cut])  # what the first replica had streamed by then
    rest = _run(engine, prompt, _continued(params, tokens[:cut], len(sent)))
    assert sent + "".join(o.new_text for o in rest) == "".join(o.new_text for o in whole)


def test_a_continuation_that_leaves_no_token_of_max_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="leaves none of max_tokens 4"):
        SamplingParams(max_tokens=4, continuation=Continuation((1, 2, 3, 4)))


def test_a_continuation_token_outside_the_vocabulary_is_refused(engine: LLMEngine) -> None:
    params = SamplingParams(max_tokens=8, continuation=Continuation((1, 10**9)))
    with pytest.raises(ValueError, match="continuation token id 1000000000 is outside the vocabulary"):
        engine.add_request("bad", [1, 2, 3], params)
