"""A pool at zero: the gateway holds its requests while a replica starts, and releases them when the
replica becomes ready — over real sockets, with a real stand-in runtime that starts late."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from frontier_gateway.config import HoldConfig
from frontier_gateway.hold import POOL_WAITING_METRIC, HoldQueue
from frontier_hostside.names import READINESS_PATH
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.harness import StandIn, free_port, gateway_config, running_gateway, tenant

ACME, NIGHTLY = "sk-acme-0123456789", "sk-nightly-0123456789"
MODEL = "model-z"


class LateStandIn(StandIn):
    """A stand-in runtime that listens on a port chosen before it starts: the address the gateway
    already knows for a replica that was not running yet."""

    def __init__(self, name: str, port: int) -> None:
        self._port = port
        super().__init__(name)

    def server_bind(self) -> None:
        self.server_address = ("127.0.0.1", self._port)
        super().server_bind()


def _config(url: str, metering: Path, *, max_requests: int = 8, timeout_s: float = 20.0):
    return gateway_config(
        {MODEL: [url]},
        [
            tenant("acme", ACME, [MODEL]),
            tenant("nightly", NIGHTLY, [MODEL], priority="batch"),
        ],
        metering,
        hold={MODEL: {"max_requests": max_requests, "timeout_s": timeout_s}},
    )


def _body(i: int = 0, **extra) -> dict:
    return {"model": MODEL, "prompt": f"hello {i}", "max_tokens": 4, **extra}


def _waiting(admin_url: str) -> float:
    text = httpx.get(admin_url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == POOL_WAITING_METRIC and sample.labels.get("pool") == MODEL:
                return sample.value
    raise AssertionError(f"{POOL_WAITING_METRIC}{{pool={MODEL!r}}} is not on /metrics")


def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


async def _send_all(url: str, count: int, *, stream: bool) -> list[tuple[int, str]]:
    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, str]:
        response = await client.post(
            f"{url}/v1/completions",
            json=_body(i, stream=stream),
            headers={"Authorization": f"Bearer {ACME}"},
        )
        return response.status_code, response.text

    async with httpx.AsyncClient(timeout=30) as client:
        return list(await asyncio.gather(*(one(client, i) for i in range(count))))


def _in_background(url: str, count: int, *, stream: bool) -> tuple[threading.Thread, list]:
    results: list = []
    thread = threading.Thread(
        target=lambda: results.extend(asyncio.run(_send_all(url, count, stream=stream))), daemon=True
    )
    thread.start()
    return thread, results


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_requests_for_a_pool_at_zero_are_held_until_a_replica_starts_then_all_answered(
    tmp_path: Path, stream: bool
) -> None:
    port = free_port()
    config = _config(f"http://127.0.0.1:{port}", tmp_path / "m.jsonl")
    with running_gateway(config, wait_ready=False) as gw:
        thread, results = _in_background(gw.url, 5, stream=stream)
        _until(lambda: _waiting(gw.admin_url) == 5)
        assert not results  # nothing answered while no replica runs
        runtime = LateStandIn("late", port)
        try:
            thread.join(timeout=20)
            assert [status for status, _ in results] == [200] * 5
            assert len(runtime.requests) == 5
            if stream:
                assert all("data: [DONE]" in text for _, text in results)
            assert _waiting(gw.admin_url) == 0
        finally:
            runtime.close()


def test_a_held_request_past_the_hold_timeout_gets_503_with_retry_after(tmp_path: Path) -> None:
    config = _config(f"http://127.0.0.1:{free_port()}", tmp_path / "m.jsonl", timeout_s=0.5)
    with running_gateway(config, wait_ready=False) as gw:
        started = time.monotonic()
        response = httpx.post(
            f"{gw.url}/v1/completions", json=_body(), headers={"Authorization": f"Bearer {ACME}"}, timeout=10
        )
        held = time.monotonic() - started
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "hold_timeout"
    assert int(response.headers["retry-after"]) >= 1
    assert 0.5 <= held < 5


def test_a_request_finding_the_hold_queue_full_gets_503_at_once(tmp_path: Path) -> None:
    config = _config(f"http://127.0.0.1:{free_port()}", tmp_path / "m.jsonl", max_requests=2, timeout_s=3)
    with running_gateway(config, wait_ready=False) as gw:
        thread, _results = _in_background(gw.url, 2, stream=False)
        _until(lambda: _waiting(gw.admin_url) == 2)
        started = time.monotonic()
        response = httpx.post(
            f"{gw.url}/v1/completions", json=_body(9), headers={"Authorization": f"Bearer {ACME}"}, timeout=10
        )
        refused_in = time.monotonic() - started
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "hold_queue_full"
        assert "max_requests = 2" in response.json()["error"]["message"]
        assert int(response.headers["retry-after"]) >= 1
        assert refused_in < 1.5  # at once, not after the 3 s hold timeout
        thread.join(timeout=10)  # the two held ones time out


def test_a_client_that_disconnects_while_held_frees_its_place(tmp_path: Path) -> None:
    port = free_port()
    config = _config(f"http://127.0.0.1:{port}", tmp_path / "m.jsonl", max_requests=1, timeout_s=20)
    with running_gateway(config, wait_ready=False) as gw:
        host, gw_port = gw.url.removeprefix("http://").split(":")
        payload = json.dumps(_body()).encode()
        leaving = socket.create_connection((host, int(gw_port)))
        leaving.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {ACME}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        _until(lambda: _waiting(gw.admin_url) == 1)
        leaving.close()
        _until(lambda: _waiting(gw.admin_url) == 0)
        # The one place is free again: the next request is held (not refused) and answered.
        thread, results = _in_background(gw.url, 1, stream=False)
        _until(lambda: _waiting(gw.admin_url) == 1)
        runtime = LateStandIn("late", port)
        try:
            thread.join(timeout=20)
            assert [status for status, _ in results] == [200]
            assert len(runtime.requests) == 1  # the client that left was never forwarded
        finally:
            runtime.close()
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert sorted(r["status"] for r in records) == [200, 499]


def test_held_interactive_requests_leave_before_held_batch_ones_then_in_arrival_order() -> None:
    async def scenario() -> list[str]:
        queue = HoldQueue(MODEL, HoldConfig(max_requests=10, timeout_s=5))
        ready = False
        order: list[str] = []

        async def held(label: str, priority: str) -> None:
            await queue.wait(priority, lambda: ready)
            order.append(label)

        tasks = []
        for label, priority in [
            ("b1", "batch"),
            ("i1", "interactive"),
            ("b2", "batch"),
            ("i2", "interactive"),
        ]:
            tasks.append(asyncio.create_task(held(label, priority)))
            await asyncio.sleep(0)  # arrival order
        assert queue.waiting == 4
        ready = True
        assert queue.release() == 4
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["i1", "i2", "b1", "b2"]


def test_a_gateway_whose_pool_is_at_zero_stays_ready_for_the_balancer_when_the_pool_holds_requests(
    tmp_path: Path,
) -> None:
    config = _config(f"http://127.0.0.1:{free_port()}", tmp_path / "m.jsonl")
    with running_gateway(config, wait_ready=False) as gw:
        public = httpx.get(gw.url + READINESS_PATH, timeout=5)
        detail = httpx.get(gw.admin_url + READINESS_PATH, timeout=5).json()
    assert public.status_code == 200  # taken out of rotation, it could never receive what starts the pool
    assert detail["models"][MODEL] == {"ready": 0, "replicas": 1}


def test_a_held_request_woken_for_a_replica_that_went_again_waits_on_in_its_place() -> None:
    async def scenario() -> tuple[int, float]:
        queue = HoldQueue(MODEL, HoldConfig(max_requests=10, timeout_s=5))
        ready = False
        task = asyncio.create_task(queue.wait("interactive", lambda: ready))
        await asyncio.sleep(0.01)
        queue.release()  # a probe saw a replica ready; it failed again before this request's turn
        await asyncio.sleep(0.01)
        still_waiting = queue.waiting
        ready = True
        queue.release()
        return still_waiting, await task

    still_waiting, held_s = asyncio.run(scenario())
    assert still_waiting == 1
    assert held_s < 5
