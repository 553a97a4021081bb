"""The HTTP surface of a continued generation (what the gateway migrates streams with): chunks that
carry their token ids only when asked, a continuation streamed from where it was cut with no second
role chunk, and a continuation the request's budget or vocabulary cannot hold refused naming the
field."""

from __future__ import annotations

import json

import httpx
from frontier_hostside import names

BODY = {"prompt": "continue me", "max_tokens": 12, "temperature": 0, "ignore_eos": True, "stream": True}


def _events(url: str, path: str, body: dict, headers: dict[str, str] | None = None) -> list[dict]:
    with httpx.stream("POST", url + path, json=body, headers=headers or {}, timeout=60) as answer:
        assert answer.status_code == 200, answer.read()
        lines = [line for line in answer.iter_lines() if line.startswith("data: {")]
    return [json.loads(line[6:]) for line in lines]


def test_chunks_carry_their_token_ids_only_when_the_header_asks(shared_server) -> None:
    plain = _events(shared_server.url, names.COMPLETIONS_PATH, BODY)
    asked = _events(shared_server.url, names.COMPLETIONS_PATH, BODY, {names.TOKEN_IDS_HEADER: "1"})
    assert all("token_ids" not in e["choices"][0] for e in plain)
    ids = [t for e in asked for t in e["choices"][0]["token_ids"]]
    assert len(ids) == 12
    assert [e["choices"][0]["text"] for e in asked] == [e["choices"][0]["text"] for e in plain]


def test_a_chat_continuation_streams_the_rest_with_no_second_role_chunk(shared_server) -> None:
    body = {**BODY, "messages": [{"role": "user", "content": "hi"}]}
    del body["prompt"]
    whole = _events(shared_server.url, names.CHAT_COMPLETIONS_PATH, body, {names.TOKEN_IDS_HEADER: "1"})
    ids = [t for e in whole for t in e["choices"][0].get("token_ids", [])]
    text = [e["choices"][0]["delta"].get("content", "") for e in whole]
    cut = 5  # the role chunk, then four one-token chunks
    sent = "".join(text[:cut])
    continued = {**body, names.CONTINUATION_FIELD: {"token_ids": ids[: cut - 1], "emitted_chars": len(sent)}}
    rest = _events(shared_server.url, names.CHAT_COMPLETIONS_PATH, continued)
    assert all("role" not in e["choices"][0]["delta"] for e in rest)
    assert sent + "".join(e["choices"][0]["delta"].get("content", "") for e in rest) == "".join(text)


def test_a_continuation_that_fills_max_tokens_is_a_400_naming_the_field(shared_server) -> None:
    body = {**BODY, "stream": False, names.CONTINUATION_FIELD: {"token_ids": [1] * 12}}
    answer = httpx.post(shared_server.url + names.COMPLETIONS_PATH, json=body, timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == names.CONTINUATION_FIELD and "leaves none of max_tokens 12" in error["message"]


def test_a_continuation_token_outside_the_vocabulary_is_a_400_naming_the_field(shared_server) -> None:
    body = {**BODY, "stream": False, names.CONTINUATION_FIELD: {"token_ids": [10**8]}}
    answer = httpx.post(shared_server.url + names.COMPLETIONS_PATH, json=body, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "frontier_continuation.token_ids"
