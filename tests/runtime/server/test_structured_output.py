"""Structured output through the official ``openai`` client over a real socket, on the tiny random
model: every output that finishes with "stop" parses and validates; bad constraints are 400s that
name the problem, and the engine keeps serving the other requests meanwhile."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from frontier_runtime.requests import RequestOutput
from server_harness import MODEL, ScriptedEngine, servers

# Nested objects, enums, arrays; bounded so that even a random model completes it within budget.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "service": {"type": "string", "maxLength": 12},
        "healthy": {"type": "boolean"},
        "tier": {"enum": ["gold", "silver", "bronze"]},
        "replicas": {"type": "integer", "minimum": 1, "maximum": 64},
        "zones": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "owner": {
            "type": "object",
            "properties": {
                "team": {"type": "string", "maxLength": 8},
                "oncall": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 9},
                    "maxItems": 2,
                },
            },
            "required": ["team", "oncall"],
            "additionalProperties": False,
        },
    },
    "required": ["service", "healthy", "tier", "replicas", "zones", "owner"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "deployment", "schema": SCHEMA, "strict": True},
}
MESSAGES = [{"role": "user", "content": "describe the deployment as JSON"}]


@pytest.fixture(scope="module")
def client(shared_server):
    with openai.OpenAI(base_url=f"{shared_server.url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def _chat(client: openai.OpenAI, seed: int, **kwargs: Any) -> tuple[str, str]:
    result = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=200, temperature=1.0, seed=seed, **kwargs
    )
    return result.choices[0].message.content, result.choices[0].finish_reason


def test_json_schema_outputs_all_parse_and_validate(client: openai.OpenAI) -> None:
    results = [_chat(client, seed, response_format=RESPONSE_FORMAT) for seed in range(12)]
    assert all(reason == "stop" for _, reason in results), results
    for text, _ in results:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len({text for text, _ in results}) > 1  # sampled, not one fixed answer


def test_json_schema_on_completions_streamed(client: openai.OpenAI) -> None:
    for seed in range(4):
        chunks = list(
            client.completions.create(
                model=MODEL,
                prompt="deployment:",
                max_tokens=200,
                temperature=1.0,
                seed=seed,
                stream=True,
                extra_body={"response_format": RESPONSE_FORMAT},
            )
        )
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(text), SCHEMA)


def test_json_mode_outputs_that_finish_parse_as_objects(client: openai.OpenAI) -> None:
    results = [_chat(client, seed, response_format={"type": "json_object"}) for seed in range(12)]
    finished = [text for text, reason in results if reason == "stop"]
    assert finished  # a random model closes its object now and then; those must all parse
    for text in finished:
        assert isinstance(json.loads(text), dict)
    for text, reason in results:
        assert reason in ("stop", "length") and text.startswith("{")


def test_regex_and_choice_extensions(client: openai.OpenAI) -> None:
    for seed in range(4):
        text, reason = _chat(client, seed, extra_body={"guided_regex": r"v[0-9]{1,2}\.[0-9]-(canary|stable)"})
        assert reason == "stop"
        assert text.startswith("v") and text.rsplit("-", 1)[1] in ("canary", "stable")
        choices = ["roll out", "roll back", "hold (wait)"]
        text, reason = _chat(client, seed, extra_body={"guided_choice": choices})
        assert (text, reason) in [(c, "stop") for c in choices]


def test_length_returns_the_partial_output_as_is(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0, response_format=RESPONSE_FORMAT
    )
    choice = result.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content.startswith('{"')  # the schema's object, cut short
    with pytest.raises(ValueError):
        json.loads(choice.message.content)


@pytest.mark.parametrize(
    ("response_format", "extra", "param", "named"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
            {},
            "response_format.json_schema.schema",
            "strin",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "if": {}, "then": {}}},
            },
            {},
            "response_format.json_schema.schema",
            '"if", "then"',
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "format": "colour"}},
            },
            {},
            "response_format.json_schema.schema",
            "colour",
        ),
        (None, {"guided_regex": "v(1"}, "guided_regex", "unclosed group"),
        (None, {"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"type": "xml"}, {}, "response_format", "json_schema"),
    ],
)
def test_bad_constraints_are_400s_naming_the_problem(
    client: openai.OpenAI, response_format: Any, extra: dict, param: str, named: str
) -> None:
    kwargs = {"response_format": response_format} if response_format else {}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, extra_body=extra, **kwargs
        )
    error = err.value.body
    assert error["param"] == param, error
    assert named in error["message"], error


def test_the_engine_keeps_serving_while_bad_constraints_are_refused(
    client: openai.OpenAI, shared_server
) -> None:
    result: dict[str, Any] = {}

    def long_request() -> None:
        result["text"], result["reason"] = _chat(client, 3, response_format=RESPONSE_FORMAT)

    worker = threading.Thread(target=long_request)
    worker.start()
    refused = 0
    for bad in (
        {"type": "strin"},
        {"type": "object", "not": {}, "if": {}},
        {"type": "string", "minLength": 5, "maxLength": 2},
    ):
        rf = {"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}}
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, response_format=rf)
        refused += 1
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, extra_body={"guided_regex": "[a-"}
        )
    worker.join(60)
    assert refused == 3 and result["reason"] == "stop"
    jsonschema.validate(json.loads(result["text"]), SCHEMA)
    shared_server.wait_idle()


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"frobnicate": 1}, "frobnicate"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"n": 2}, "n"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"min_p": 0.1}, "min_p"),
        ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
        ({"store": True}, "store"),
        ({"stream_options": {"include_usage": True, "extra": 1}}, "stream_options.extra"),
        ({"priority": 3}, "priority"),
        ({"stop": ["}"], "guided_regex": "a+"}, "stop"),
        ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice"),
    ],
)
def test_unsupported_fields_are_400s_naming_them(client: openai.OpenAI, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, extra_body=extra)
    assert err.value.body["param"] == param, err.value.body


def test_unknown_fields_are_refused_on_completions_too(shared_server) -> None:
    response = httpx.post(f"{shared_server.url}/v1/completions", json={"prompt": "x", "best_of_n": 2})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "best_of_n"
    assert "unknown field" in response.json()["error"]["message"]


def test_no_op_values_of_unimplemented_fields_and_priority_are_accepted(client: openai.OpenAI) -> None:
    extra = {
        "n": 1,
        "store": False,
        "presence_penalty": 0,
        "min_p": 0.0,
        "tool_choice": "none",
        "priority": "batch",
    }
    result = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, temperature=0, user="u-1", extra_body=extra
    )
    assert result.choices[0].finish_reason in ("stop", "length")


class _StopEngine(ScriptedEngine):
    """A scripted engine whose output ends with "stop" though it is not JSON: the real grammar
    library never lets that happen, so only a stand-in reaches the path that logs such output."""

    async def _stream(self, request_id: str, prompt_tokens: int) -> AsyncIterator[RequestOutput]:
        async for out in super()._stream(request_id, prompt_tokens):
            if out.finished:
                out.finish_reason = "stop"
            yield out


def test_an_output_that_fails_its_check_is_logged_raw_and_counted(
    codec: Any, tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with ExitStack() as stack:
        srv = stack.enter_context(servers(_StopEngine(tokens=(5, 6)), codec, tiny_model))()
        with caplog.at_level(logging.WARNING, logger="frontier_runtime.server"):
            body = httpx.post(
                f"{srv.url}/v1/chat/completions",
                json={"messages": MESSAGES, "max_tokens": 2, "response_format": {"type": "json_object"}},
            ).json()
        assert body["choices"][0]["message"]["content"] == "<5><6>"  # returned as is
        records = [r for r in caplog.records if getattr(r, "raw_output", None) is not None]
        assert [r.raw_output for r in records] == ["<5><6>"]
        assert "not valid JSON" in records[0].problem
        metrics = httpx.get(f"{srv.url}/metrics").text
        assert 'frontier_request_failures_total{reason="structured_output_invalid"} 1.0' in metrics


def test_a_large_schema_is_compiled_off_the_event_loop_and_still_checked(client: openai.OpenAI) -> None:
    properties = {f"field_{i}": {"enum": ["on", "off"]} for i in range(120)}
    good = {
        "type": "object",
        "properties": properties,
        "required": ["field_0"],
        "additionalProperties": False,
    }
    assert len(json.dumps(good)) > 4096
    rf = {"type": "json_schema", "json_schema": {"name": "big", "schema": good}}
    text, reason = _chat(client, 0, response_format=rf)
    if reason == "stop":
        jsonschema.validate(json.loads(text), good)
    bad = {**good, "properties": {**properties, "broken": {"type": "strin"}}}
    rf = {"type": "json_schema", "json_schema": {"name": "big", "schema": bad}}
    with pytest.raises(openai.BadRequestError, match="strin"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, response_format=rf)
