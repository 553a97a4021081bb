"""The gateway in front of real runtime processes of two tiny models of different shapes: routing
by model, a replica killed mid-load, and session affinity that reuses a replica's prefix cache."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from frontier_hostside import names
from frontier_hostside.names import PREFIX_CACHE_HITS_METRIC

from tests.gateway.harness import (
    RuntimeProcess,
    gateway_config,
    running_gateway,
    start_runtime,
    tenant,
    wait_ready,
)

pytestmark = pytest.mark.slow

KEY = "sk-acme-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _config(runtimes: list[RuntimeProcess], metering: Path, **extra):
    models: dict[str, list[str]] = {}
    for rt in runtimes:
        models.setdefault(rt.model, []).append(rt.url)
    return gateway_config(models, [tenant("acme", KEY, sorted(models))], metering, **extra)


def test_two_models_of_different_shapes_are_served_by_their_own_pools(runtimes, tmp_path) -> None:
    with running_gateway(_config(runtimes, tmp_path / "m.jsonl")) as gw:
        for model in ("tiny-a", "tiny-b"):
            answer = httpx.post(
                f"{gw.url}/v1/completions",
                json={"model": model, "prompt": "hello there", "max_tokens": 5},
                headers=AUTH,
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == model
            assert answer.json()["usage"]["completion_tokens"] == 5
            replica = answer.headers[names.REPLICA_HEADER]
            assert replica in [r.id for r in gw.gateway.pools.get(model).replicas]


def test_session_affinity_keeps_a_conversation_on_one_replica_and_hits_its_prefix_cache(
    runtimes, tmp_path
) -> None:
    pool = [rt for rt in runtimes if rt.model == "tiny-a"]
    before = {rt.url: rt.metric(PREFIX_CACHE_HITS_METRIC + "_total") for rt in pool}
    system = "You are a careful assistant. " * 12  # well over one 16-token KV block
    messages = [{"role": "system", "content": system}]
    served = []
    with running_gateway(_config(runtimes, tmp_path / "m.jsonl")) as gw:
        url_of = {r.id: r.url for r in gw.gateway.pools.get("tiny-a").replicas}
        for turn in range(4):
            messages.append({"role": "user", "content": f"question number {turn}, please answer briefly"})
            answer = httpx.post(
                f"{gw.url}/v1/chat/completions",
                json={"model": "tiny-a", "messages": messages, "max_tokens": 8, "temperature": 0},
                headers={**AUTH, "x-session-id": "conversation-1"},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
            served.append(answer.headers[names.REPLICA_HEADER])
            messages.append(
                {"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]}
            )
    assert len(set(served)) == 1, served
    after = {rt.url: rt.metric(PREFIX_CACHE_HITS_METRIC + "_total") for rt in pool}
    # Turns 2..4 reuse the cached blocks of the turns before them, on that replica only.
    url = url_of[served[0]]
    assert after[url] - before[url] >= 3 * 16
    other = next(other for other in after if other != url)
    assert after[other] == before[other]


def test_a_replica_killed_mid_load_fails_no_request_that_had_not_started_streaming(
    tiny_models, tmp_path
) -> None:
    pool = [
        start_runtime("tiny-a", tiny_models["tiny-a"], tmp_path),
        start_runtime("tiny-a", tiny_models["tiny-a"], tmp_path),
    ]
    try:
        wait_ready(pool)
        outcomes: list[tuple[str, int, bool]] = []  # (kind, status, had received bytes)
        lock = threading.Lock()
        stop = threading.Event()

        def client(i: int) -> None:
            n = 0
            with httpx.Client(timeout=60) as http:
                while not stop.is_set():
                    n += 1
                    body = {
                        "model": "tiny-a",
                        "prompt": f"client {i} request {n}",
                        "max_tokens": 24,
                        "ignore_eos": True,
                    }
                    if i % 2:
                        started = False
                        status = 0
                        try:
                            with http.stream(
                                "POST",
                                f"{gw.url}/v1/completions",
                                json={**body, "stream": True},
                                headers=AUTH,
                            ) as response:
                                status = response.status_code
                                done = False
                                for line in response.iter_lines():
                                    started = started or line.startswith("data: {")
                                    if line.startswith("data: {") and "error" in json.loads(line[6:]):
                                        status = 502
                                    done = done or line == "data: [DONE]"
                                if status == 200 and not done:
                                    status = 502
                        except httpx.HTTPError:
                            status = 599
                        with lock:
                            outcomes.append(("stream", status, started))
                    else:
                        try:
                            status = http.post(
                                f"{gw.url}/v1/completions", json=body, headers=AUTH
                            ).status_code
                        except httpx.HTTPError:
                            status = 599
                        with lock:
                            outcomes.append(("plain", status, False))

        with running_gateway(_config(pool, tmp_path / "m.jsonl", retries=2)) as gw:
            threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
            for thread in threads:
                thread.start()
            time.sleep(2.0)
            # Killed while it holds requests: what it holds must move to the other replica or, once
            # its stream started, fail (on a busy machine a moment of none in flight is likely).
            deadline = time.monotonic() + 10
            while pool[0].metric(names.RUNNING_METRIC) < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            pool[0].kill()
            time.sleep(3.0)
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
            metrics = httpx.get(f"{gw.admin_url}/metrics").text
    finally:
        for rt in pool:
            rt.kill()
    failed = [o for o in outcomes if o[1] != 200]
    assert len(outcomes) >= 12
    # Only streams that had already sent data may fail; every other request found the live replica.
    assert all(kind == "stream" and started for kind, _, started in failed), failed
    assert sum(o[1] == 200 for o in outcomes) >= len(outcomes) - 3
    # What was in flight on the killed replica moved to the other one: sent again before any byte
    # (a retry), moved mid-generation (a migration), or, a stream already started that could not
    # move, failed as allowed above.
    moved = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(
            (names.GATEWAY_RETRIES_METRIC + "_total{", names.GATEWAY_MIGRATIONS_METRIC + "_total{")
        )
    )
    assert moved + len(failed) >= 1, metrics
    down = f'frontier_gateway_replica_ready{{model="tiny-a",replica="{pool[0].url}"}} 0.0'
    assert down in metrics
