"""The local autoscaler reads a real runtime's /metrics: its queue, what it runs, and the TTFT
histogram whose p90 between two scrapes is its latency signal."""

from __future__ import annotations

import math
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import pytest

from frontier.hosts.inventory import HostSpec
from frontier.targets.local.autoscaler import bucket_p90_ms, scrape
from tests.gateway.harness import RuntimeProcess, start_runtime, wait_ready
from tests.verify.harness import SHAPE

MODEL = "tiny-scrape"


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    from frontier_runtime.tiny import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("autoscaler-runtime")
    process = start_runtime(MODEL, make_tiny_checkpoint(root / MODEL, seed=2, **SHAPE), root / "work")
    try:
        wait_ready([process])
        yield process
    finally:
        process.kill()


def test_the_ttft_p90_between_two_scrapes_covers_the_requests_served_between_them(runtime):
    address = urlparse(runtime.url)
    host = HostSpec(name="host-1", address=str(address.hostname), ssh_port=22, root="/tmp", group="cpu")
    before = scrape(host, int(address.port or 0))
    assert before is not None and (before.waiting, before.running) == (0, 0)
    body = {"model": MODEL, "prompt": "the of and to in", "max_tokens": 2, "stream": True}
    for _ in range(3):
        with httpx.stream("POST", runtime.url + "/v1/completions", json=body, timeout=30) as reply:
            reply.read()
    after = scrape(host, int(address.port or 0))
    assert after is not None
    assert after.ttft_buckets[math.inf] - before.ttft_buckets.get(math.inf, 0.0) == 3
    p90 = bucket_p90_ms(before.ttft_buckets, after.ttft_buckets)
    assert p90 is not None and 0 < p90 < 30_000
