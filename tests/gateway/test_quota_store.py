"""Quotas shared by the gateways of a stack through a real redis-server (``quota.store: redis``),
and what ``memory`` means: each gateway process counts on its own."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import httpx
from frontier_hostside import names

from tests.gateway.harness import StandIn, free_port, gateway_config, running_gateway, tenant

KEY = "sk-shared-0123456789"


def _config(standins: dict[str, StandIn], metering: Path, redis_url: str | None, **quota):
    store = (
        {"store": "redis", "redis_url": redis_url, "key_prefix": f"test-{uuid.uuid4().hex[:12]}"}
        if redis_url
        else {"store": "memory"}
    )
    return gateway_config(
        {"model-a": [standins["a1"].url, standins["a2"].url]},
        [tenant("acme", KEY, ["model-a"], **quota)],
        metering,
        quota=store,
    )


def _complete(url: str, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/completions",
        json={"model": "model-a", "prompt": "hello", "max_tokens": max_tokens},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=10,
    )


def _sent(standins: dict[str, StandIn]) -> int:
    return len(standins["a1"].requests) + len(standins["a2"].requests)


def test_two_gateways_on_one_redis_enforce_one_requests_per_minute_quota(
    standins, tmp_path, redis_url
) -> None:
    config = _config(standins, tmp_path / "m.jsonl", redis_url, rpm=4)
    with running_gateway(config) as first, running_gateway(config) as second:
        answers = [_complete(gw.url) for gw in (first, second, first, second)]
        refused = [_complete(gw.url) for gw in (first, second)]
    assert [a.status_code for a in answers] == [200] * 4
    assert [a.headers[names.REMAINING_REQUESTS] for a in answers] == ["3", "2", "1", "0"]
    assert [r.status_code for r in refused] == [429, 429]
    assert "requests per min (RPM): limit 4" in refused[1].json()["error"]["message"]
    assert _sent(standins) == 4  # together, not 4 each


def test_two_gateways_share_one_tokens_per_minute_quota_settled_with_usage(
    standins, tmp_path, redis_url
) -> None:
    config = _config(standins, tmp_path / "m.jsonl", redis_url, tpm=100)
    with running_gateway(config) as first, running_gateway(config) as second:
        # Estimate 2 + 40 taken up front; the stand-in reports 10 + 40 used: 50 gone after settling.
        assert _complete(first.url, max_tokens=40).status_code == 200
        after_second = _complete(second.url, max_tokens=40)
        third = _complete(first.url, max_tokens=40)
    assert after_second.status_code == 200
    # 100 - 50 - 42, plus what refilled meanwhile (100/min: under 2 a second)
    assert 8 <= int(after_second.headers[names.REMAINING_TOKENS]) <= 14
    assert third.status_code == 429 and third.json()["error"]["type"] == "tokens"


def test_two_gateways_share_one_concurrency_limit(standins, tmp_path, redis_url) -> None:
    config = _config(standins, tmp_path / "m.jsonl", redis_url, concurrency=1)
    with running_gateway(config) as first, running_gateway(config) as second:
        standins["a1"].delay_s = standins["a2"].delay_s = 1.0
        held = threading.Thread(target=_complete, args=(first.url,))
        held.start()  # one request held open on the first gateway
        deadline = time.monotonic() + 10
        while _sent(standins) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        refused = _complete(second.url)
        held.join()
        standins["a1"].delay_s = standins["a2"].delay_s = 0.0
        freed = _complete(second.url)
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "concurrency"
    assert freed.status_code == 200  # the first gateway gave the slot back in the store


def test_the_memory_store_counts_per_gateway_process(standins, tmp_path) -> None:
    config = _config(standins, tmp_path / "m.jsonl", None, rpm=2)
    with running_gateway(config) as first, running_gateway(config) as second:
        answers = [_complete(gw.url) for gw in (first, first, second, second)]
        refused = _complete(first.url)
    assert [a.status_code for a in answers] == [200] * 4  # each gateway allows the tenant its 2
    assert refused.status_code == 429


def test_an_unreachable_quota_store_refuses_with_503_and_sends_nothing(standins, tmp_path) -> None:
    config = _config(standins, tmp_path / "m.jsonl", f"redis://127.0.0.1:{free_port()}/0")
    with running_gateway(config) as gw:
        answer = _complete(gw.url)
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert error["code"] == "quota_store_unavailable" and "quota store did not answer" in error["message"]
    assert answer.headers["retry-after"] == "1"
    assert _sent(standins) == 0
