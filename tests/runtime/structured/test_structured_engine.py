"""Constrained requests in the engine: outputs that follow their constraint, unconstrained companions
whose outputs do not change, partial outputs on length, matchers released however a request ends."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import SamplingParams, StructuredOutput

SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["pod", "node"]},
        "ready": {"type": "boolean"},
        "labels": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
        "spec": {
            "type": "object",
            "properties": {"cpu": {"type": "integer", "minimum": 1, "maximum": 16}},
            "required": ["cpu"],
            "additionalProperties": False,
        },
    },
    "required": ["kind", "ready", "labels", "spec"],
    "additionalProperties": False,
}
CONSTRAINED = StructuredOutput("json_schema", json.dumps(SCHEMA))


def _run(
    engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]
) -> dict[str, tuple[str, str]]:
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    text = {rid: "" for rid in requests}
    reason: dict[str, str] = {}
    while engine.has_unfinished():
        for out in engine.step():
            text[out.request_id] += out.new_text
            if out.finished:
                reason[out.request_id] = out.finish_reason
    return {rid: (text[rid], reason[rid]) for rid in requests}


def _prompts(engine: LLMEngine, n: int) -> list[list[int]]:
    return [engine.tokenizer.encode(f"request number {i} of the batch") for i in range(n)]


def test_constrained_outputs_validate_and_free_text_neighbours_are_unchanged(engine: LLMEngine) -> None:
    prompts = _prompts(engine, 8)
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    alone = _run(engine, {f"a{i}": (prompts[i], free) for i in range(0, 8, 2)})
    mixed = {}
    for i in range(8):
        if i % 2:
            params = SamplingParams(max_tokens=120, temperature=1.0, seed=i, structured=CONSTRAINED)
        else:
            params = free
        mixed[f"m{i}"] = (prompts[i], params)
    got = _run(engine, mixed)
    for i in range(0, 8, 2):
        assert got[f"m{i}"] == alone[f"a{i}"]  # same text, same finish: the masks touched no other row
    for i in range(1, 8, 2):
        text, reason = got[f"m{i}"]
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(engine.structured._matchers) == 0


def test_the_grammar_finishes_a_request_even_with_ignore_eos(engine: LLMEngine) -> None:
    params = SamplingParams(
        max_tokens=60,
        temperature=1.0,
        seed=1,
        ignore_eos=True,
        structured=StructuredOutput("choice", '["yes", "no"]'),
    )
    ((text, reason),) = _run(engine, {"c": (_prompts(engine, 1)[0], params)}).values()
    assert (text, reason) in [("yes", "stop"), ("no", "stop")]


def test_length_cuts_a_constrained_output_and_returns_it_as_is(engine: LLMEngine) -> None:
    params = SamplingParams(max_tokens=3, temperature=0.0, structured=CONSTRAINED)
    ((text, reason),) = _run(engine, {"l": (_prompts(engine, 1)[0], params)}).values()
    assert reason == "length" and text.startswith("{")
    assert len(engine.structured._matchers) == 0


def test_an_aborted_constrained_request_releases_its_matcher(engine: LLMEngine) -> None:
    engine.add_request("x", _prompts(engine, 1)[0], SamplingParams(max_tokens=50, structured=CONSTRAINED))
    engine.step()
    assert "x" in engine.structured
    engine.abort("x")
    engine.step()
    assert "x" not in engine.structured and not engine.has_unfinished()


def test_a_bad_constraint_is_refused_at_add_and_leaves_nothing(engine: LLMEngine) -> None:
    with pytest.raises(ValueError, match="unclosed group"):
        engine.add_request("bad", [5, 6], SamplingParams(structured=StructuredOutput("regex", "(a")))
    assert "bad" not in engine.structured and not engine.has_unfinished()


def test_masks_not_yet_started_by_the_helper_are_filled_by_the_engine_thread(engine: LLMEngine) -> None:
    import threading
    from types import SimpleNamespace

    decoder = engine.structured
    decoder.add("m1", StructuredOutput("choice", '["yes", "no"]'))
    try:
        ready = decoder.start(
            [SimpleNamespace(request_id="other"), SimpleNamespace(request_id="m1")]
        ).result()
        release = threading.Event()
        decoder._pool.submit(release.wait, 10)  # the helper thread is busy: the next fill cannot start
        inline = decoder.start(
            [SimpleNamespace(request_id="other"), SimpleNamespace(request_id="m1")]
        ).result()
        release.set()
        assert inline.rows == ready.rows == [1]
        assert torch.equal(inline.bits, ready.bits)
        allowed = {
            t for t in range(engine.model_config.vocab_size) if inline.bits[0, t // 32] >> (t % 32) & 1
        }
        assert allowed and all(engine.tokenizer.decode([t]) in ("y", "ye", "yes", "n", "no") for t in allowed)
    finally:
        decoder.release("m1")
