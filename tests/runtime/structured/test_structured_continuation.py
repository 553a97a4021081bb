"""A constrained generation continued elsewhere: its grammar state is rebuilt by feeding the tokens
already generated through the grammar, so the continuation finishes the same valid output; tokens
the grammar refuses are refused with the position that broke it."""

from __future__ import annotations

import json

import jsonschema
import pytest
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import Continuation, SamplingParams, StructuredOutput

SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["pod", "node"]},
        "cpu": {"type": "integer", "minimum": 1, "maximum": 64},
    },
    "required": ["kind", "cpu"],
    "additionalProperties": False,
}
CONSTRAINED = StructuredOutput("json_schema", json.dumps(SCHEMA))


def _tokens(engine: LLMEngine, rid: str, prompt: list[int], params: SamplingParams) -> tuple[list[int], str]:
    engine.add_request(rid, prompt, params)
    tokens: list[int] = []
    reason = ""
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid:
                tokens += out.new_token_ids
                reason = out.finish_reason or reason
    return tokens, reason


def test_a_constrained_continuation_rebuilds_the_grammar_state_and_ends_in_the_same_valid_output(
    engine: LLMEngine,
) -> None:
    prompt = engine.tokenizer.encode("describe a workload")
    params = SamplingParams(max_tokens=80, temperature=1.0, seed=5, structured=CONSTRAINED)
    whole, reason = _tokens(engine, "whole", prompt, params)
    assert reason == "stop"
    cut = len(whole) // 2
    continued = SamplingParams(**{**params.__dict__, "continuation": Continuation(tuple(whole[:cut]))})
    rest, reason = _tokens(engine, "rest", prompt, continued)
    assert whole[:cut] + rest == whole
    assert reason == "stop"
    jsonschema.validate(json.loads(engine.tokenizer.decode(whole)), SCHEMA)
    assert len(engine.structured._matchers) == 0


def test_a_continuation_the_grammar_refuses_is_refused_naming_the_token_and_position(
    engine: LLMEngine,
) -> None:
    prompt = engine.tokenizer.encode("describe a workload")
    not_json = tuple(engine.tokenizer.encode("hello"))
    params = SamplingParams(max_tokens=40, structured=CONSTRAINED, continuation=Continuation(not_json))
    with pytest.raises(ValueError, match=rf"continuation token {not_json[0]} \(position 0\) is refused"):
        engine.add_request("refused", prompt, params)
    assert "refused" not in engine.structured
