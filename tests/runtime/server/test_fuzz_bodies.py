"""Property: whatever the body, the server answers with a status below 500, and every error is
OpenAI-shaped. Bodies mix plausible fields with arbitrary JSON, so most reach deep validation."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_harness import MODEL, servers

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
any_json = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
small_ints = st.integers(min_value=-3, max_value=3)
texts = st.text(max_size=40)  # includes lone surrogates, control characters, emoji
token_ids = st.lists(st.integers(min_value=-5, max_value=5000), max_size=8)

sampling = {
    "model": st.one_of(st.just(MODEL), any_json),
    "max_tokens": st.one_of(small_ints, any_json),
    "temperature": st.one_of(st.floats(-1, 3), any_json),
    "top_p": st.one_of(st.floats(-0.5, 1.5), any_json),
    "top_k": st.one_of(st.integers(-2, 10_000_000), any_json),
    "seed": st.one_of(st.integers(-(2**64), 2**64), any_json),
    "stop": st.one_of(texts, st.lists(texts, max_size=20), any_json),
    "stop_token_ids": st.one_of(token_ids, any_json),
    "stream": st.one_of(st.booleans(), any_json),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), any_json),
    "ignore_eos": st.booleans(),
    "n": st.one_of(small_ints, any_json),
    "presence_penalty": st.one_of(st.just(0), any_json),
}
completion_bodies = st.fixed_dictionaries(
    {"prompt": st.one_of(texts, token_ids, st.lists(texts, max_size=3), any_json)},
    optional={**sampling, "logprobs": st.one_of(st.integers(-2, 25), any_json), "echo": st.booleans()},
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "bogus"]), any_json)},
        optional={
            "content": st.one_of(
                texts, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts})), any_json
            )
        },
    ),
    max_size=4,
)
chat_bodies = st.fixed_dictionaries(
    {"messages": st.one_of(messages, any_json)},
    optional={
        **sampling,
        "max_completion_tokens": st.one_of(small_ints, any_json),
        "logprobs": st.one_of(st.booleans(), any_json),
        "top_logprobs": st.one_of(st.integers(-2, 25), any_json),
    },
)


@pytest.fixture(scope="module")
def client(engine, codec, tiny_model):
    # A short context keeps clamped generations (max_tokens omitted) to a few dozen tokens.
    with servers(engine, codec, tiny_model) as start:
        srv = start(model__max_seq_len=32)
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            yield c


def _check(response: httpx.Response, sent: object) -> None:
    assert response.status_code < 500, (sent, response.status_code, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    elif response.headers["content-type"].startswith("text/event-stream"):
        assert response.text.rstrip().endswith("data: [DONE]")
    else:
        assert response.json()["choices"]


def _post(client: httpx.Client, path: str, body: object) -> httpx.Response:
    try:
        content = json.dumps(body).encode()
    except ValueError:
        content = repr(body).encode()
    return client.post(path, content=content, headers={"content-type": "application/json"})


@FUZZ
@given(body=completion_bodies)
def test_no_completion_body_causes_a_500(client: httpx.Client, body: dict) -> None:
    _check(_post(client, "/v1/completions", body), body)


@FUZZ
@given(body=chat_bodies)
def test_no_chat_body_causes_a_500(client: httpx.Client, body: dict) -> None:
    _check(_post(client, "/v1/chat/completions", body), body)


@settings(FUZZ, max_examples=30)
@given(raw=st.one_of(st.binary(max_size=200), any_json.map(lambda v: json.dumps(v).encode())))
def test_no_raw_body_causes_a_500(client: httpx.Client, raw: bytes) -> None:
    for path in ("/v1/completions", "/v1/chat/completions"):
        _check(client.post(path, content=raw), raw)
