"""Raw HTTP against the runtime: every refusal is an OpenAI-shaped error with the right status."""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import pytest
from frontier_runtime.server.auth import ApiKeys
from server_harness import MODEL

KEY = "sk-test-key-1"


@pytest.fixture
def srv(shared_server):
    """The module's shared server: for tests that change nothing."""
    return shared_server


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_oversize_body_is_413_before_the_body_is_read(serve) -> None:
    srv = serve(max_body_bytes=4096)
    with socket.create_connection(("127.0.0.1", srv.port)) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000000\r\n\r\n{"
        )
        sock.settimeout(10)
        answer = b""
        while b'"}}' not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    text = answer.decode()
    assert text.startswith("HTTP/1.1 413")
    assert '"code":"body_too_large"' in text.replace(" ", "")


def test_oversize_chunked_body_is_413(serve) -> None:
    srv = serve(max_body_bytes=4096)

    def chunks():
        for _ in range(10):
            yield b"x" * 1000

    error = _error(httpx.post(f"{srv.url}/v1/completions", content=chunks()), 413)
    assert "4096" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"", None),
        (json.dumps({"model": MODEL}).encode(), "prompt"),
        (json.dumps({"prompt": "x", "temperature": 5}).encode(), "temperature"),
        (json.dumps({"prompt": "x", "top_p": 0}).encode(), "top_p"),
        (json.dumps({"prompt": "x", "max_tokens": 0}).encode(), "max_tokens"),
        (json.dumps({"prompt": "x", "n": 2}).encode(), "n"),
        (json.dumps({"prompt": "x", "seed": -1}).encode(), "seed"),
        (json.dumps({"prompt": "x", "stop": [""]}).encode(), "stop"),
        (json.dumps({"prompt": "x", "presence_penalty": 0.5}).encode(), "presence_penalty"),
        (json.dumps({"prompt": [1, 2, 999999]}).encode(), "prompt"),
        (json.dumps({"prompt": ["a", "b"]}).encode(), "prompt"),
        (b'{"prompt": "x", "temperature": NaN}', "temperature"),
    ],
)
def test_bad_completion_bodies_are_400(srv, body: bytes, param: str | None) -> None:
    error = _error(httpx.post(f"{srv.url}/v1/completions", content=body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ([{"role": "wizard", "content": "x"}], "messages.0.role"),
        ([{"role": "tool", "content": "x"}], "messages"),  # the model's template refuses the role
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "messages.0.content",
        ),
    ],
)
def test_bad_chat_messages_are_400(srv, messages: list, param: str) -> None:
    error = _error(httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": messages}), 400)
    assert error["param"] == param


def test_omitted_max_tokens_clamps_to_the_room_left(serve, codec) -> None:
    srv = serve(model__max_seq_len=24)
    prompt = "the river and the mountain"
    body = httpx.post(
        f"{srv.url}/v1/completions", json={"prompt": prompt, "ignore_eos": True}, timeout=30
    ).json()
    assert body["usage"]["prompt_tokens"] == len(codec.encode(prompt))
    assert body["usage"]["total_tokens"] == 24
    assert body["choices"][0]["finish_reason"] == "length"


def test_a_prompt_that_fills_the_context_is_400(serve) -> None:
    srv = serve(model__max_seq_len=16)
    error = _error(httpx.post(f"{srv.url}/v1/completions", json={"prompt": list(range(5, 21))}), 400)
    assert error["code"] == "context_length_exceeded" and "16" in error["message"]


def test_unknown_model_is_404(srv) -> None:
    error = _error(
        httpx.post(
            f"{srv.url}/v1/chat/completions",
            json={"model": "nope", "messages": [{"role": "user", "content": "x"}]},
        ),
        404,
    )
    assert (error["code"], error["type"]) == ("model_not_found", "invalid_request_error")


def test_a_runtime_answers_to_its_aliases_under_the_name_asked_and_lists_only_its_own(serve) -> None:
    srv = serve(model__aliases=["interactive-name"])
    body = {"model": "interactive-name", "prompt": "x", "max_tokens": 1}
    answer = httpx.post(f"{srv.url}/v1/completions", json=body)
    assert answer.status_code == 200 and answer.json()["model"] == "interactive-name"
    assert httpx.post(f"{srv.url}/v1/completions", json={**body, "model": MODEL}).json()["model"] == MODEL
    assert _error(httpx.post(f"{srv.url}/v1/completions", json={**body, "model": "nope"}), 404)
    assert [card["id"] for card in httpx.get(f"{srv.url}/v1/models").json()["data"]] == [MODEL]


@pytest.mark.parametrize("aliases", [[MODEL], ["a", "a"], [""]])
def test_aliases_that_repeat_a_name_are_refused(aliases) -> None:
    from frontier_runtime.config import ConfigError
    from server_harness import runtime_config

    with pytest.raises(ConfigError, match="aliases"):
        runtime_config("/weights", model__aliases=aliases)


def test_unknown_route_and_wrong_method_are_json_errors(srv) -> None:
    assert _error(httpx.get(f"{srv.url}/v1/engines"), 404)["code"] == "not_found"
    assert _error(httpx.get(f"{srv.url}/v1/completions"), 405)["code"] == "method_not_allowed"


def test_request_id_is_echoed_or_made(srv) -> None:
    mine = httpx.post(
        f"{srv.url}/v1/completions",
        json={"prompt": "x", "max_tokens": 1},
        headers={"X-Request-Id": "abc-123"},
    )
    assert mine.headers["x-request-id"] == "abc-123"
    made = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert len(made.headers["x-request-id"]) == 32
    bad = httpx.post(
        f"{srv.url}/v1/completions", json={"prompt": 1}, headers={"X-Request-Id": "no spaces\tallowed"}
    )
    assert bad.status_code == 400 and bad.headers["x-request-id"] != "no spaces\tallowed"


def test_the_same_request_id_twice_at_once_is_fine(srv) -> None:
    body = {"prompt": "x", "max_tokens": 20, "ignore_eos": True}
    with httpx.Client(base_url=srv.url, headers={"X-Request-Id": "dup"}, timeout=30) as client:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda _: client.post("/v1/completions", json=body), range(2)))
    assert [r.status_code for r in results] == [200, 200]


def test_auth_guards_every_inference_route_but_not_health(serve) -> None:
    srv = serve(api_keys=ApiKeys([KEY]))
    body = {"prompt": "x", "max_tokens": 1}
    for path, method, payload in [
        ("/v1/completions", "POST", body),
        ("/v1/chat/completions", "POST", {"messages": [{"role": "user", "content": "x"}]}),
        ("/v1/models", "GET", None),
    ]:
        r = httpx.request(method, f"{srv.url}{path}", json=payload)
        # OpenAI's type for a bad key, as the gateway answers it: a client's mistake.
        assert (_error(r, 401)["code"], _error(r, 401)["type"]) == (
            "invalid_api_key",
            "invalid_request_error",
        )
        assert r.headers["www-authenticate"] == "Bearer"
        wrong = httpx.request(
            method, f"{srv.url}{path}", json=payload, headers={"Authorization": "Bearer sk-wrong"}
        )
        assert wrong.status_code == 401
    ok = httpx.post(f"{srv.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200
    assert httpx.get(f"{srv.url}/health/live").status_code == 200
    assert httpx.get(f"{srv.url}/health/ready").status_code == 200
    metrics = httpx.get(f"{srv.url}/metrics").text
    assert 'frontier_request_failures_total{reason="unauthorized"} 6.0' in metrics


def test_draining_refuses_new_work_and_fails_readiness(serve) -> None:
    srv = serve()
    srv.state.health.draining = True
    error = _error(httpx.post(f"{srv.url}/v1/completions", json={"prompt": "x", "max_tokens": 1}), 503)
    assert error["code"] == "draining"
    ready = httpx.get(f"{srv.url}/health/ready")
    assert ready.status_code == 503 and "draining" in ready.json()["reasons"]
    assert httpx.get(f"{srv.url}/health/live").status_code == 200


def test_a_stuck_engine_loop_fails_liveness_and_readiness(serve) -> None:
    srv = serve()
    srv.state.health.heartbeat = lambda: time.monotonic() - 3600
    assert httpx.get(f"{srv.url}/health/live").status_code == 503
    ready = httpx.get(f"{srv.url}/health/ready")
    assert ready.status_code == 503 and "engine loop stuck" in ready.json()["reasons"]


def test_health_paths_come_from_the_config(serve) -> None:
    srv = serve(health__liveness_path="/livez", health__readiness_path="/readyz")
    assert httpx.get(f"{srv.url}/livez").status_code == 200
    assert httpx.get(f"{srv.url}/readyz").status_code == 200
    assert httpx.get(f"{srv.url}/health/ready").status_code == 404


def test_one_json_log_line_per_request(srv, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="frontier_runtime.requests")
    httpx.post(
        f"{srv.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers={"X-Request-Id": "log-1"}
    )
    deadline = time.monotonic() + 5  # the line is written just after the last byte is sent
    while not (records := [r for r in caplog.records if getattr(r, "request_id", None) == "log-1"]):
        assert time.monotonic() < deadline, "no request log line"
        time.sleep(0.01)
    (record,) = records
    assert record.status == 200 and record.completion_tokens == 2 and record.path == "/v1/completions"
    assert record.prompt_tokens >= 1 and record.duration_ms > 0 and "queue_ms" in record.__dict__
