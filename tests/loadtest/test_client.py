"""The streaming client against a real HTTP server that speaks server-sent events over a socket."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from frontier.loadtest.client import (
    BackgroundLoad,
    LoadTestError,
    Target,
    arrival_times,
    prompt_words,
    run_concurrency,
    run_steps,
    stream_request,
)
from frontier.loadtest.client import _client as client_for
from tests.loadtest.sse_server import SseServer


def one(server: SseServer, model: str = "ok", **kw) -> object:
    target = Target(base_url=server.url, model=model, api_key="k-1", **kw)

    async def go():
        async with client_for(target) as client:
            return await stream_request(client, target, "hello there")

    return asyncio.run(go())


def test_a_stream_is_timed_chunk_by_chunk():
    with SseServer(tokens=5, first_s=0.1, gap_s=0.02) as server:
        sample = one(server)
    assert sample.ok and sample.error is None
    assert 0.1 <= sample.ttft_s < 0.5
    assert len(sample.itl_s) == 4  # five content chunks, keep-alive comments ignored
    assert all(gap >= 0.015 for gap in sample.itl_s)
    assert sample.e2el_s == pytest.approx(sample.ttft_s + sum(sample.itl_s))
    assert (sample.output_tokens, sample.prompt_tokens) == (5, 7)  # from the usage chunk


def test_the_request_streams_with_usage_and_sends_the_api_key():
    with SseServer() as server:
        one(server, max_tokens=9)
        path, body, auth = server.requests[0]
    assert path == "/v1/completions"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 9
    assert auth == "Bearer k-1"


def test_chat_deltas_count_as_content():
    with SseServer(tokens=3) as server:
        sample = one(server, endpoint="chat")
        path, body, _ = server.requests[0]
    assert path == "/v1/chat/completions" and body["messages"][0]["role"] == "user"
    assert sample.ok and len(sample.itl_s) == 2


@pytest.mark.parametrize(
    ("model", "kind"), [("busy", "http_429"), ("truncate", "truncated"), ("error", "stream_error")]
)
def test_failures_become_samples_classified_by_kind(model, kind):
    with SseServer() as server:
        sample = one(server, model=model)
    assert not sample.ok and sample.error == kind


def test_a_refused_connection_is_a_connect_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but never listening: connections are refused
        target = Target(base_url=f"http://127.0.0.1:{port}", model="ok", timeout_s=2)

        async def go():
            async with client_for(target) as client:
                return await stream_request(client, target, "x")

        sample = asyncio.run(go())
    assert sample.error == "connect"


def test_a_slow_server_is_a_timeout():
    with SseServer(first_s=1.5) as server:
        sample = one(server, timeout_s=0.5)
    assert sample.error == "timeout"


def test_poisson_gaps_have_the_rate_as_mean_and_burstiness_sets_their_spread():
    rng = np.random.default_rng(7)
    poisson = np.diff([0.0, *arrival_times(10.0, 2000.0, rng, burstiness=1.0)])
    steady = np.diff([0.0, *arrival_times(10.0, 2000.0, rng, burstiness=4.0)])
    assert poisson.mean() == pytest.approx(0.1, rel=0.03)
    assert steady.mean() == pytest.approx(0.1, rel=0.03)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1
    assert steady.std() / steady.mean() == pytest.approx(0.5, rel=0.05)  # gamma shape 4: CV 1/2


def test_rates_and_durations_are_range_checked():
    rng = np.random.default_rng(0)
    with pytest.raises(LoadTestError, match="rate = 0"):
        arrival_times(0, 1, rng)
    with pytest.raises(LoadTestError, match="burstiness = -1"):
        arrival_times(1, 1, rng, burstiness=-1)
    with pytest.raises(LoadTestError, match="step duration"):
        asyncio.run(run_steps(Target(base_url="http://x", model="ok"), [1.0], 0))


def test_a_step_load_attributes_requests_to_the_step_that_sent_them():
    with SseServer(tokens=3, first_s=0.01, gap_s=0.01) as server:
        target = Target(base_url=server.url, model="ok")
        steps = asyncio.run(run_steps(target, [5.0, 40.0], 1.0, seed=3))
        total = len(server.requests)
    assert [s.rate_rps for s in steps] == [5.0, 40.0]
    assert steps[0].window[1] == pytest.approx(steps[1].window[0])
    assert all(steps[0].window[0] <= x.sent_at < steps[0].window[1] + 0.05 for x in steps[0].samples)
    assert len(steps[1].samples) > len(steps[0].samples)
    assert sum(len(s.samples) for s in steps) == total
    assert all(x.ok for s in steps for x in s.samples)


def test_fixed_concurrency_never_has_more_requests_in_flight_than_clients():
    in_flight = peak = 0

    def track(kind, sample):
        nonlocal in_flight, peak
        in_flight += 1 if kind == "sent" else -1
        peak = max(peak, in_flight)

    with SseServer(tokens=2, first_s=0.02, gap_s=0.01) as server:
        result = asyncio.run(run_concurrency(Target(base_url=server.url, model="ok"), 3, 0.5, on_event=track))
    assert peak == 3
    assert len(result.samples) >= 6 and all(s.ok for s in result.samples)


def test_background_load_returns_every_request_it_sent_when_stopped():
    with SseServer(tokens=2, first_s=0.01, gap_s=0.01) as server:
        load = BackgroundLoad(Target(base_url=server.url, model="ok"), rate=30.0).start()
        asyncio.run(asyncio.sleep(0.7))
        samples = load.stop()
        sent, failed = load.counts()
    assert len(samples) == sent == len(server.requests) > 5
    assert failed == 0


def test_a_prompt_mix_draws_each_requests_length_from_the_mix():
    target = Target(base_url="http://x", model="m", prompt_tokens=64, prompt_mix=(64, 1024))
    rng = np.random.default_rng(0)
    drawn = {prompt_words(target, rng) for _ in range(50)}
    assert drawn == {48, 768}  # about 0.75 words per token
    assert prompt_words(Target(base_url="http://x", model="m", prompt_tokens=64), rng) == 48
