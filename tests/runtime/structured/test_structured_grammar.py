"""Grammars from constraints, the bitmask kernel and the output check, without a model."""

from __future__ import annotations

import json

import pytest
import torch
from frontier_runtime.requests import SamplingParams, StructuredOutput
from frontier_runtime.structured.bitmask import TokenBitmask, words_for
from frontier_runtime.structured.grammar import GrammarError, compile_grammar
from frontier_runtime.structured.validate import output_problem


@pytest.mark.parametrize(
    ("output", "named"),
    [
        (StructuredOutput("json_schema", '{"type": "strin"}'), "Invalid type: strin"),
        (StructuredOutput("json_schema", '{"type": "object", "if": {}, "then": {}}'), '"if", "then"'),
        (StructuredOutput("json_schema", '{"type": "string", "format": "colour"}'), "Unknown format: colour"),
        (StructuredOutput("json_schema", '{"type": "string", "minLength": 3, "maxLength": 1}'), "minLength"),
        (StructuredOutput("json_schema", "{oops"), "not valid JSON"),
        (StructuredOutput("json_schema", "[1, 2]"), "must be an object"),
        (StructuredOutput("regex", "a(b"), "unclosed group"),
        (StructuredOutput("regex", ""), "empty"),
        (StructuredOutput("choice", "[]"), "non-empty list"),
    ],
)
def test_a_constraint_that_cannot_compile_names_the_problem(output: StructuredOutput, named: str) -> None:
    with pytest.raises(GrammarError) as err:
        compile_grammar(output)
    assert named in str(err.value)


def test_compiled_grammars_are_cached() -> None:
    output = StructuredOutput(
        "json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})
    )
    assert compile_grammar(output) is compile_grammar(StructuredOutput(output.kind, output.spec))


def test_stop_sequences_cannot_cut_a_constrained_output() -> None:
    with pytest.raises(ValueError, match="stop sequences"):
        SamplingParams(stop=("}",), structured=StructuredOutput("json_object"))


def test_the_bitmask_masks_only_the_constrained_rows() -> None:
    vocab = 100
    logits = torch.randn(3, vocab)
    before = logits.clone()
    allowed = {0, 31, 32, 65, 99}
    bits = torch.zeros(1, words_for(vocab), dtype=torch.int32)
    for t in allowed:
        word = bits[0, t // 32].item() | (1 << (t % 32))
        bits[0, t // 32] = word - (1 << 32) if word >= 1 << 31 else word  # as a signed int32
    TokenBitmask([1], bits).apply(logits)
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    kept = {i for i in range(vocab) if logits[1, i] != float("-inf")}
    assert kept == allowed
    assert torch.equal(logits[1, sorted(allowed)], before[1, sorted(allowed)])


def test_logits_wider_than_the_mask_disallow_the_padding() -> None:
    logits = torch.zeros(1, 70)
    bits = torch.full((1, words_for(40)), -1, dtype=torch.int32)  # every token of a 64-token mask
    TokenBitmask([0], bits).apply(logits)
    assert (logits[0, :64] == 0).all() and (logits[0, 64:] == float("-inf")).all()


def test_the_output_check() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}, "required": ["n"]}
    js = StructuredOutput("json_schema", json.dumps(schema))
    assert output_problem(js, '{"n": 2}') is None
    assert "not valid JSON" in output_problem(js, '{"n": 2')
    assert "at n" in output_problem(js, '{"n": 7}')
    assert output_problem(StructuredOutput("json_object"), "{}") is None
    assert "not an object" in output_problem(StructuredOutput("json_object"), "[1]")
    assert output_problem(StructuredOutput("choice", '["a b", "c"]'), "a b") is None
    assert output_problem(StructuredOutput("choice", '["a b", "c"]'), "a") is not None
    assert output_problem(StructuredOutput("regex", "[0-9]+"), "123") is None
    assert output_problem(StructuredOutput("regex", "[0-9]+"), "12a") is not None
