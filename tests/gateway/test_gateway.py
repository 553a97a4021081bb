"""The gateway over real sockets against small real HTTP stand-ins for runtimes: routing by model,
keys, quotas with OpenAI's headers, priority, streaming usage, retries, readiness, metering, metrics."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from frontier_gateway.quotas import format_duration
from frontier_hostside import names

from tests.gateway.harness import StandIn, gateway_config, running_gateway, tenant

ACME, NIGHTLY, SMALL = "sk-acme-0123456789", "sk-nightly-0123456789", "sk-small-0123456789"


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _config(standins: dict[str, StandIn], metering: Path, *tenants: dict, **extra):
    models = {"model-a": [standins["a1"].url, standins["a2"].url], "model-b": [standins["b1"].url]}
    tenants = tenants or (
        tenant("acme", ACME, ["model-a", "model-b"]),
        tenant("nightly", NIGHTLY, ["model-b"], priority="batch"),
    )
    return gateway_config(models, list(tenants), metering, **extra)


def _complete(url: str, key: str, model: str, **body) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": "hello", "max_tokens": 4, **body},
        headers=_auth(key),
        timeout=10,
    )


def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_requests_go_to_the_pool_serving_their_model(standins, tmp_path) -> None:
    # No affinity: the replica comes from least-outstanding alone (prompt-prefix hashing over the
    # stand-ins' random ports could send all four prompts to one replica).
    config = _config(standins, tmp_path / "m.jsonl", affinity={"mode": "off"})
    with running_gateway(config) as gw:
        _until(lambda: gw.gateway.pools.get("model-a").ready_count == 2)  # both probed ready
        for i in range(4):
            assert _complete(gw.url, ACME, "model-a", prompt=f"hello {i}").json()["served_by"] in ("a1", "a2")
        assert _complete(gw.url, ACME, "model-b").json()["served_by"] == "b1"
        # Least outstanding with rotating ties: both replicas of model-a took work.
        assert standins["a1"].requests and standins["a2"].requests
        unknown = _complete(gw.url, ACME, "gpt-4")
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "model_not_found"
        listed = httpx.get(f"{gw.url}/v1/models", headers=_auth(NIGHTLY)).json()
        assert [m["id"] for m in listed["data"]] == ["model-b"]


def test_a_key_not_allowed_a_model_gets_404_and_no_key_401(standins, tmp_path) -> None:
    with running_gateway(_config(standins, tmp_path / "m.jsonl")) as gw:
        refused = _complete(gw.url, NIGHTLY, "model-a")
        assert refused.status_code == 404
        assert "does not exist or you do not have access to it" in refused.json()["error"]["message"]
        assert refused.json()["error"]["type"] == "invalid_request_error"
        assert not standins["a1"].requests and not standins["a2"].requests
        keyless = httpx.post(f"{gw.url}/v1/completions", json={"model": "model-a", "prompt": "x"})
        assert keyless.status_code == 401
        assert (keyless.json()["error"]["code"], keyless.json()["error"]["type"]) == (
            "invalid_api_key",
            "invalid_request_error",
        )
        assert _complete(gw.url, "sk-wrong", "model-a").status_code == 401


def test_a_tenant_over_its_requests_per_minute_gets_429_while_another_is_served(standins, tmp_path) -> None:
    config = _config(
        standins,
        tmp_path / "m.jsonl",
        tenant("small", SMALL, ["model-a"], rpm=3),
        tenant("acme", ACME, ["model-a"]),
    )
    with running_gateway(config) as gw:
        answers = [_complete(gw.url, SMALL, "model-a") for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert [a.headers[names.REMAINING_REQUESTS] for a in answers] == ["2", "1", "0"]
        over = _complete(gw.url, SMALL, "model-a")
        assert over.status_code == 429
        error = over.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
        assert "requests per min (RPM): limit 3" in error["message"]
        assert over.headers[names.LIMIT_REQUESTS] == "3"
        assert over.headers[names.REMAINING_REQUESTS] == "0"
        # A full bucket of 3/min refills one request every 20 s: reset is just under a minute.
        reset = over.headers[names.RESET_REQUESTS]
        # (a slow machine may take seconds between the requests: the bucket refills meanwhile)
        minutes, _, seconds = reset.rstrip("s").rpartition("m")
        assert 40 <= 60 * int(minutes or 0) + float(seconds) <= 60, reset
        assert 15 <= int(over.headers["retry-after"]) <= 21
        sent = len(standins["a1"].requests) + len(standins["a2"].requests)
        assert sent == 3  # the refused request never reached a runtime
        other = _complete(gw.url, ACME, "model-a")
        assert other.status_code == 200
        assert other.headers[names.LIMIT_REQUESTS] == "1000"


def test_tokens_per_minute_counts_the_estimate_then_settles_with_usage(standins, tmp_path) -> None:
    config = _config(
        standins,
        tmp_path / "m.jsonl",
        tenant("small", SMALL, ["model-a"], tpm=100),
        tenant("acme", ACME, ["model-a"]),
    )
    with running_gateway(config) as gw:
        # Estimate: "hello" = 2 tokens + max_tokens 40; the stand-in then reports 10 + 40 used.
        first = _complete(gw.url, SMALL, "model-a", max_tokens=40)
        assert first.status_code == 200
        assert first.headers[names.LIMIT_TOKENS] == "100"
        # 100 - 42, plus what refilled meanwhile (100/min: under 2 a second)
        assert 58 <= int(first.headers[names.REMAINING_TOKENS]) <= 62
        assert int(httpx.get(f"{gw.url}/v1/models", headers=_auth(SMALL)).status_code) == 200
        second = _complete(gw.url, SMALL, "model-a", max_tokens=40)
        assert second.status_code == 200
        third = _complete(gw.url, SMALL, "model-a", max_tokens=40)
        assert third.status_code == 429
        assert third.json()["error"]["type"] == "tokens"
        assert "tokens per min (TPM): limit 100" in third.json()["error"]["message"]
        assert int(third.headers[names.REMAINING_TOKENS]) < 42
        assert third.headers[names.RESET_TOKENS].endswith("s")
        assert _complete(gw.url, ACME, "model-a", max_tokens=40).status_code == 200
        too_big = _complete(gw.url, SMALL, "model-a", max_tokens=500)
        assert (
            too_big.status_code == 429
            and "larger than the per-minute limit" in too_big.json()["error"]["message"]
        )


def test_the_tenants_priority_class_reaches_the_runtime(standins, tmp_path) -> None:
    with running_gateway(_config(standins, tmp_path / "m.jsonl")) as gw:
        _complete(gw.url, NIGHTLY, "model-b")
        _complete(gw.url, ACME, "model-b")
        _complete(gw.url, ACME, "model-b", priority="batch")
        # A batch tenant cannot raise its own class.
        _complete(gw.url, NIGHTLY, "model-b", priority="interactive")
        assert [body["priority"] for _, body, _ in standins["b1"].requests] == [
            "batch",
            "interactive",
            "batch",
            "batch",
        ]
        bad = _complete(gw.url, ACME, "model-b", priority="urgent")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"
        # The tenant's key never travels on to a runtime.
        assert all("Authorization" not in headers for _, _, headers in standins["b1"].requests)


def _stream(url: str, key: str, **body) -> tuple[list[dict], httpx.Response]:
    events = []
    with httpx.stream(
        "POST",
        f"{url}/v1/completions",
        json={"model": "model-a", "prompt": "hi", "max_tokens": 3, "stream": True, **body},
        headers=_auth(key),
        timeout=10,
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events, response


def test_streams_are_metered_from_the_runtimes_usage(standins, tmp_path) -> None:
    metering = tmp_path / "metering.jsonl"
    with running_gateway(_config(standins, metering)) as gw:
        events, response = _stream(gw.url, ACME)
        assert response.status_code == 200 and response.headers[names.REMAINING_REQUESTS] == "999"
        # The gateway asked for usage on the client's behalf and kept it to itself.
        assert [e["choices"][0]["text"] for e in events] == ["t0", "t1", "t2"]
        [(_, sent, _)] = standins["a1"].requests + standins["a2"].requests
        assert sent["stream_options"] == {"include_usage": True}
        events, _ = _stream(gw.url, ACME, stream_options={"include_usage": True})
        assert events[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
        _complete(gw.url, NIGHTLY, "model-b", max_tokens=7)
        metrics = httpx.get(f"{gw.admin_url}/metrics").text
    records = [json.loads(line) for line in metering.read_text().splitlines()]
    assert [
        (r["tenant"], r["model"], r["prompt_tokens"], r["completion_tokens"], r["status"]) for r in records
    ] == [
        ("acme", "model-a", 10, 3, 200),
        ("acme", "model-a", 10, 3, 200),
        ("nightly", "model-b", 10, 7, 200),
    ]
    assert records[0]["stream"] and records[0]["ttft_ms"] is not None and records[0]["latency_ms"] > 0
    assert records[2]["priority"] == "batch"
    assert 'frontier_gateway_requests_total{model="model-a",status="200",tenant="acme"} 2.0' in metrics
    assert 'frontier_gateway_tokens_total{kind="completion",model="model-b",tenant="nightly"} 7.0' in metrics


def test_a_dead_or_busy_replica_is_skipped_before_anything_is_sent(standins, tmp_path) -> None:
    dead = StandIn("dead")
    dead_url = dead.url
    dead.close()  # nothing listens there any more
    standins["a1"].status = 503  # draining: answers, but refuses work
    config = gateway_config(
        {"model-a": [dead_url, standins["a1"].url, standins["a2"].url]},
        [tenant("acme", ACME, ["model-a"])],
        tmp_path / "m.jsonl",
        retries=2,
    )
    with running_gateway(config) as gw:
        # The prober has not seen the dead one fail yet if it is fast; force it ready to test the proxy.
        for replica in gw.gateway.pools.get("model-a").replicas:
            replica.ready = True
        answers = [_complete(gw.url, ACME, "model-a") for _ in range(6)]
    assert [a.status_code for a in answers] == [200] * 6
    assert {a.json()["served_by"] for a in answers} == {"a2"}


def test_readiness_holds_only_while_every_model_has_a_ready_replica(standins, tmp_path) -> None:
    with running_gateway(_config(standins, tmp_path / "m.jsonl")) as gw:
        assert httpx.get(f"{gw.url}/health/ready").status_code == 200
        standins["b1"].ready = False
        deadline = time.monotonic() + 5
        while httpx.get(f"{gw.url}/health/ready").status_code != 503:
            assert time.monotonic() < deadline, "readiness never dropped"
            time.sleep(0.05)
        assert httpx.get(f"{gw.url}/health/ready").json() == {"ready": False}  # no model named
        body = httpx.get(f"{gw.admin_url}/health/ready").json()
        assert body["models"]["model-b"] == {"ready": 0, "replicas": 1}
        answer = _complete(gw.url, ACME, "model-b")
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "no_replica"
        assert _complete(gw.url, ACME, "model-a").status_code == 200
        assert httpx.get(f"{gw.url}/health/live").status_code == 200


def test_concurrency_quota_and_bad_bodies(standins, tmp_path) -> None:
    config = _config(standins, tmp_path / "m.jsonl", tenant("small", SMALL, ["model-a"], concurrency=1))
    with running_gateway(config) as gw:
        for standin in (standins["a1"], standins["a2"]):
            standin.delay_s = 1.0
        held = threading.Thread(target=_complete, args=(gw.url, SMALL, "model-a"))
        held.start()  # one request held open by a slow replica
        _until(lambda: len(standins["a1"].requests) + len(standins["a2"].requests) == 1)
        refused = _complete(gw.url, SMALL, "model-a")
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "concurrency"
        held.join()
        assert _complete(gw.url, SMALL, "model-a").status_code == 200
        assert httpx.post(f"{gw.url}/v1/completions", content=b"{", headers=_auth(SMALL)).status_code == 400
        assert (
            httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x"}, headers=_auth(SMALL)).json()[
                "error"
            ]["param"]
            == "model"
        )


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.12, "120ms"), (1.5, "1.5s"), (360, "6m0s"), (61.25, "1m1.25s")]
)
def test_reset_durations_read_like_openais(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_tokens_come_back_when_no_runtime_served_the_request(standins, tmp_path) -> None:
    config = _config(standins, tmp_path / "m.jsonl", tenant("small", SMALL, ["model-a"], tpm=100))
    with running_gateway(config) as gw:
        standins["a1"].status = standins["a2"].status = 400  # e.g. a prompt over the context length
        refused = _complete(gw.url, SMALL, "model-a", max_tokens=60)
        assert refused.status_code == 400
        assert int(refused.headers[names.REMAINING_TOKENS]) < 40  # taken up front
        standins["a1"].status = standins["a2"].status = 200
        # The 62 tokens were given back when the 400 came: a full-size request fits again.
        assert _complete(gw.url, SMALL, "model-a", max_tokens=90).status_code == 200
