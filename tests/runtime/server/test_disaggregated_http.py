"""Disaggregation over the HTTP API, as vLLM's proxy drives it: the prefill replica's completion
carries ``kv_transfer_params`` back, the decode replica takes them in the request body and answers
the whole completion; a failed pull under ``on_failure: fail`` is a 502 naming the prefill replica.
Real runtimes (each its own engine and KV transfer listener) under uvicorn on loopback sockets."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from frontier_hostside import names
from frontier_runtime.server.serve import Loaded, build_engine
from frontier_runtime.server.text import TextCodec
from server_harness import RunningServer, runtime_config, start_server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Start = Callable[..., RunningServer]


@pytest.fixture(scope="module")
def replicas(tiny_model: Path, codec: TextCodec) -> Iterator[Start]:
    """``start(**overrides)``: a runtime with an engine of its own (its role's listener or pulls)."""
    started: list[tuple[RunningServer, Any]] = []

    def start(**overrides: Any) -> RunningServer:
        config = runtime_config(tiny_model, **overrides)
        engine = build_engine(config, tiny_model)
        srv = start_server(config, lambda: Loaded(engine=engine, codec=codec, api_keys=None))
        started.append((srv, engine))
        return srv

    yield start
    for srv, engine in started:
        srv.stop()
        engine.shutdown()


@pytest.fixture(scope="module")
def prefill(replicas: Start) -> RunningServer:
    return replicas(kv_transfer__role="prefill", kv_transfer__host="127.0.0.1", kv_transfer__port=free_port())


@pytest.fixture(scope="module")
def decode(replicas: Start) -> RunningServer:
    return replicas(kv_transfer__role="decode")


def metric(url: str, name: str) -> float:
    """The sum of one family's samples on a runtime's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    )


def completion(url: str, prompt: list[int], **fields: Any) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True, **fields}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


PROMPT = [random.Random(5).randrange(1, 500) for _ in range(150)]


def test_a_prefill_answers_with_kv_transfer_params_and_the_decode_completes_as_a_colocated_replica(
    shared_server: RunningServer, prefill: RunningServer, decode: RunningServer
) -> None:
    first = completion(prefill.url, PROMPT, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    assert first.status_code == 200, first.text
    params = first.json()["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_host"] == "127.0.0.1" and len(params["remote_block_ids"]) == (150 - 1) // 16
    assert {"remote_engine_id", "remote_request_id", "remote_port", "tp_size"} <= set(params)
    handed = completion(decode.url, PROMPT, kv_transfer_params=params)
    assert handed.status_code == 200, handed.text
    assert "kv_transfer_params" not in handed.json()
    colocated = completion(shared_server.url, PROMPT)
    assert handed.json()["choices"][0]["text"] == colocated.json()["choices"][0]["text"]
    assert metric(decode.url, names.KV_TRANSFER_BLOCKS_PULLED_METRIC + "_total") == (150 - 1) // 16
    assert metric(decode.url, names.KV_TRANSFER_PULL_FAILURES_METRIC + "_total") == 0


def test_a_prefill_counts_the_leases_it_holds_until_they_are_claimed(
    prefill: RunningServer, decode: RunningServer
) -> None:
    prompt = [random.Random(6).randrange(1, 500) for _ in range(100)]
    first = completion(prefill.url, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    assert metric(prefill.url, names.KV_TRANSFER_LEASES_METRIC) == 1
    assert (
        completion(decode.url, prompt, kv_transfer_params=first.json()["kv_transfer_params"]).status_code
        == 200
    )
    deadline = time.monotonic() + 5
    while metric(prefill.url, names.KV_TRANSFER_LEASES_METRIC) != 0:  # claimed: freed by the idle loop
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_failed_pull_under_policy_fail_answers_502_naming_the_prefill_replica(replicas: Start) -> None:
    strict = replicas(kv_transfer__role="decode", kv_transfer__on_failure="fail")
    gone = free_port()  # nothing listens there: the prefill replica is gone
    params = {
        "do_remote_prefill": True,
        "remote_engine_id": "e0",
        "remote_request_id": "r0",
        "remote_host": "127.0.0.1",
        "remote_port": gone,
        "remote_block_ids": list(range(9)),
    }
    answer = completion(strict.url, PROMPT, kv_transfer_params=params)
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert error["code"] == "kv_transfer_failed"
    assert f"prefill replica 127.0.0.1:{gone} (engine e0)" in error["message"]


def test_a_prefill_request_to_a_decode_replica_is_a_400_naming_the_role(decode: RunningServer) -> None:
    answer = completion(decode.url, PROMPT, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    assert answer.status_code == 400
    assert "kv_transfer.role 'prefill', this one is 'decode'" in answer.json()["error"]["message"]
