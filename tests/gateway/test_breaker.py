"""The circuit breaker: a replica whose answers keep failing leaves the rotation for a cool-off and
comes back through one trial request; a pool with no replica left answers 503 at once.

The state machine is specified on the breaker itself with a clock the test moves; the rest runs
over real sockets against stand-in runtimes that answer 500 when told to."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from frontier_gateway.breaker import Breaker, State
from frontier_gateway.config import BreakerConfig
from frontier_hostside import names

from tests.gateway.harness import StandIn, gateway_config, running_gateway, tenant

KEY = "sk-acme-0123456789"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _breaker(**settings) -> tuple[Breaker, Clock]:
    clock = Clock()
    config = BreakerConfig(
        **{"window_s": 10, "error_rate": 0.5, "min_requests": 4, "cool_off_s": 5, **settings}
    )
    return Breaker(config, "r1", clock), clock


def _answer(breaker: Breaker, *statuses: int) -> None:
    for status in statuses:
        assert breaker.claim()
        breaker.record(status)


def test_the_breaker_opens_only_once_it_has_min_requests_over_the_error_rate() -> None:
    breaker, _ = _breaker()
    _answer(breaker, 500, 500, 500)
    assert breaker.state is State.CLOSED  # three failures, but fewer than min_requests answers
    _answer(breaker, 500)
    assert breaker.state is State.OPEN and not breaker.claim()


def test_an_error_rate_at_the_threshold_does_not_open_it() -> None:
    breaker, _ = _breaker()
    _answer(breaker, 500, 200, 502, 200)
    assert breaker.state is State.CLOSED


def test_failures_older_than_the_window_are_forgotten() -> None:
    breaker, clock = _breaker()
    _answer(breaker, 500, 500, 500)
    clock.now += 11
    _answer(breaker, 500, 200)
    assert breaker.state is State.CLOSED


def test_busy_or_draining_answers_count_neither_way() -> None:
    breaker, _ = _breaker()
    _answer(breaker, 429, 503, 429, 503, 429, 503)
    _answer(breaker, 0, 0, 0)  # 0: the connection failed
    assert breaker.state is State.CLOSED
    _answer(breaker, 504)
    assert breaker.state is State.OPEN


def test_after_the_cool_off_exactly_one_trial_goes_through() -> None:
    breaker, clock = _breaker()
    _answer(breaker, 500, 500, 500, 500)
    clock.now += 4.9
    assert breaker.retry_after_s() == pytest.approx(0.1)
    clock.now += 0.1
    assert breaker.state is State.HALF_OPEN
    assert breaker.claim() and not breaker.claim() and not breaker.available()


def test_a_successful_trial_closes_the_breaker() -> None:
    breaker, clock = _breaker()
    _answer(breaker, 500, 500, 500, 500)
    clock.now += 5
    _answer(breaker, 200)
    assert breaker.state is State.CLOSED
    _answer(breaker, 500, 500, 500)  # a fresh window: the old failures are gone
    assert breaker.state is State.CLOSED


def test_a_failed_trial_opens_it_for_another_cool_off() -> None:
    breaker, clock = _breaker()
    _answer(breaker, 500, 500, 500, 500)
    clock.now += 5
    _answer(breaker, 500)
    assert breaker.state is State.OPEN and breaker.retry_after_s() == 5


def test_a_trial_whose_client_left_leaves_the_replica_half_open() -> None:
    breaker, clock = _breaker()
    _answer(breaker, 500, 500, 500, 500)
    clock.now += 5
    assert breaker.claim()
    breaker.record(None)
    assert breaker.state is State.HALF_OPEN and breaker.claim()


def test_an_answer_sent_before_the_trip_does_not_close_it() -> None:
    breaker, _ = _breaker()
    assert breaker.claim()  # a request out while the others fail
    _answer(breaker, 500, 500, 500, 500)
    breaker.record(200)
    assert breaker.state is State.OPEN


# -- over real sockets ----------------------------------------------------------------------------


def _config(standins: dict[str, StandIn], metering: Path, cool_off_s: float):
    return gateway_config(
        {"model-a": [standins["a1"].url, standins["a2"].url]},
        [tenant("acme", KEY, ["model-a"])],
        metering,
        affinity={"mode": "off"},  # least outstanding, ties rotating: requests alternate
        breaker={"window_s": 60, "error_rate": 0.5, "min_requests": 4, "cool_off_s": cool_off_s},
    )


def _complete(url: str, timeout: float = 10) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/completions",
        json={"model": "model-a", "prompt": "hello", "max_tokens": 4},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=timeout,
    )


def _replica(gw, standin: StandIn):
    return next(r for r in gw.gateway.pools.get("model-a").replicas if r.url == standin.url)


def _until_tripped(gw, *failing: StandIn, most: int = 40) -> list[int]:
    statuses = []
    while not all(_replica(gw, s).breaker.state is State.OPEN for s in failing):
        assert len(statuses) < most, f"no trip after {most} requests: {statuses}"
        statuses.append(_complete(gw.url).status_code)
    return statuses


def test_a_failing_replica_is_taken_out_and_no_request_fails_after_the_trip(standins, tmp_path) -> None:
    failing, healthy = standins["a1"], standins["a2"]
    failing.status = 500  # answers its readiness probe, fails every request
    with running_gateway(_config(standins, tmp_path / "m.jsonl", cool_off_s=60)) as gw:
        before = _until_tripped(gw, failing)
        sent_to_failing = len(failing.requests)
        after = [_complete(gw.url) for _ in range(20)]
        metrics = httpx.get(gw.admin_url + names.METRICS_PATH, timeout=10).text
    assert before.count(500) == 4  # min_requests failures tripped it
    assert [a.status_code for a in after] == [200] * 20
    assert {a.json()["served_by"] for a in after} == {"a2"}
    assert len(failing.requests) == sent_to_failing  # none went there during the cool-off
    assert healthy.requests
    [line] = [
        x
        for x in metrics.splitlines()
        if x.startswith(names.GATEWAY_REPLICA_BREAKER_METRIC + "{") and failing.url in x
    ]
    assert line.endswith(" 1.0")


def test_with_every_replica_out_the_gateway_answers_503_with_retry_after_at_once(standins, tmp_path) -> None:
    for standin in (standins["a1"], standins["a2"]):
        standin.status = 500
    with running_gateway(_config(standins, tmp_path / "m.jsonl", cool_off_s=30)) as gw:
        _until_tripped(gw, standins["a1"], standins["a2"])
        sent = len(standins["a1"].requests) + len(standins["a2"].requests)
        for standin in (standins["a1"], standins["a2"]):
            standin.delay_s = 5.0  # a request that reached one would outlast the client's patience
        answer = _complete(gw.url, timeout=3)
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert error["code"] == "no_replica" and "out of rotation" in error["message"]
    assert 1 <= int(answer.headers["retry-after"]) <= 30
    assert len(standins["a1"].requests) + len(standins["a2"].requests) == sent


def test_a_recovered_replica_comes_back_through_one_trial_and_the_breaker_closes(standins, tmp_path) -> None:
    failing = standins["a1"]
    failing.status = 500
    with running_gateway(_config(standins, tmp_path / "m.jsonl", cool_off_s=0.5)) as gw:
        _until_tripped(gw, failing)
        failing.status = 200  # repaired
        deadline = time.monotonic() + 10
        while _replica(gw, failing).breaker.state is not State.HALF_OPEN:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        served = [_complete(gw.url).json()["served_by"] for _ in range(6)]
        state = _replica(gw, failing).breaker.state
    assert state is State.CLOSED
    assert served.count("a1") >= 2  # the trial, then its share of the rotation again
