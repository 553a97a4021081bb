"""One request's trace from the gateway to the runtime: a real gateway on a real socket in front of
a real runtime process, both exporting over OTLP/HTTP to the local stack's real receiver.

The runtime process finds the receiver through ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (how the
local stack points its processes at it); the gateway through its config's ``tracing.endpoint``."""

from __future__ import annotations

import io
import itertools
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from frontier_hostside import names
from rich.console import Console

from frontier.demo.trace import EXPECTED, print_request_trace
from frontier.targets.local.traces import ReceivedSpan, TraceReceiver, trace_of
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
MODEL = "tiny-a"
GATEWAY_SPANS = ("gateway.request", "gateway.auth", "gateway.quota", "gateway.route", "gateway.upstream")
RUNTIME_SPANS = ("runtime.request", "runtime.prepare", "runtime.queue", "runtime.prefill", "runtime.decode")


@pytest.fixture(scope="module")
def receiver() -> Iterator[TraceReceiver]:
    receiver = TraceReceiver().start()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def runtime(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, receiver: TraceReceiver
) -> Iterator[RuntimeProcess]:
    """One runtime process whose environment names the receiver, as on the local stack."""
    with pytest.MonkeyPatch.context() as env:  # start_runtime hands os.environ to the process
        env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
        process = start_runtime(MODEL, tiny_models[MODEL], tmp_path_factory.mktemp("traced-runtime"))
    try:
        wait_ready([process])
        yield process
    finally:
        process.kill()


def traced_gateway(runtime: RuntimeProcess, receiver: TraceReceiver, tmp_path: Path, **tracing: Any) -> Any:
    config = gateway_config(
        {MODEL: [runtime.url]},
        [tenant("acme", KEY, [MODEL])],
        tmp_path / "metering.jsonl",
        tracing={"endpoint": receiver.url, "batch_delay_ms": 20, **tracing},
    )
    return running_gateway(config)


def complete(url: str, stream: bool = False, headers: dict[str, str] | None = None) -> httpx.Response:
    answer = httpx.post(
        url + names.COMPLETIONS_PATH,
        json={"model": MODEL, "prompt": "hello", "max_tokens": 5, "ignore_eos": True, "stream": stream},
        headers={**AUTH, **(headers or {})},
        timeout=60,
    )
    return answer


def trace_of_request(receiver: TraceReceiver, request_id: str, count: int) -> list[ReceivedSpan]:
    """The spans of the trace whose gateway root names ``request_id``, once ``count`` have come."""

    def root(spans: list[ReceivedSpan]) -> ReceivedSpan | None:
        return next(
            (
                s
                for s in spans
                if s.name == "gateway.request" and s.attributes.get("frontier.request_id") == request_id
            ),
            None,
        )

    def complete_(spans: list[ReceivedSpan]) -> bool:
        found = root(spans)
        return found is not None and len(trace_of(spans, found.trace_id)) >= count

    spans = receiver.wait_for(complete_, timeout=20)
    found = root(spans)
    assert found is not None
    return trace_of(spans, found.trace_id)


def named(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {span.name: span for span in spans}


@pytest.fixture(scope="module")
def one_trace(
    runtime: RuntimeProcess, receiver: TraceReceiver, tmp_path_factory: pytest.TempPathFactory
) -> tuple[httpx.Response, dict[str, ReceivedSpan]]:
    """One non-streamed request through a traced gateway, and its trace."""
    with traced_gateway(runtime, receiver, tmp_path_factory.mktemp("gw")) as gw:
        answer = complete(gw.url)
    assert answer.status_code == 200, answer.text
    spans = trace_of_request(receiver, answer.headers[names.REQUEST_ID_HEADER], 10)
    return answer, named(spans)


def test_one_request_is_one_trace_with_every_span(one_trace: tuple[httpx.Response, dict]) -> None:
    _, spans = one_trace
    assert sorted(spans) == sorted((*GATEWAY_SPANS, *RUNTIME_SPANS))
    assert len({span.trace_id for span in spans.values()}) == 1
    assert {spans[n].service for n in GATEWAY_SPANS} == {"frontier-gateway"}
    assert {spans[n].service for n in RUNTIME_SPANS} == {"frontier-runtime"}


def test_the_gateways_steps_are_children_of_its_root(one_trace: tuple[httpx.Response, dict]) -> None:
    _, spans = one_trace
    root = spans["gateway.request"]
    assert root.parent_id == ""
    assert {spans[n].parent_id for n in GATEWAY_SPANS[1:]} == {root.span_id}


def test_the_runtimes_spans_hang_under_the_gateways_upstream_span(
    one_trace: tuple[httpx.Response, dict],
) -> None:
    _, spans = one_trace
    upstream, server = spans["gateway.upstream"], spans["runtime.request"]
    assert server.parent_id == upstream.span_id
    assert {spans[n].parent_id for n in RUNTIME_SPANS[1:]} == {server.span_id}
    # One machine, one clock: the runtime's work lies inside the gateway's call to it. Its server
    # span closes only after the answer is written, which the gateway may have read already.
    assert upstream.start_ns <= server.start_ns
    assert spans[RUNTIME_SPANS[-1]].end_ns <= upstream.end_ns


def test_the_runtimes_phases_add_up_within_its_server_span(one_trace: tuple[httpx.Response, dict]) -> None:
    _, spans = one_trace
    phases = [spans[n] for n in RUNTIME_SPANS[1:]]
    server = spans["runtime.request"]
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(phases))
    assert server.start_ns == phases[0].start_ns and phases[-1].end_ns <= server.end_ns
    assert sum(phase.duration_ms for phase in phases) <= server.duration_ms


def test_the_route_names_the_pool_and_the_replicas_opaque_id(one_trace: tuple[httpx.Response, dict]) -> None:
    answer, spans = one_trace
    route = spans["gateway.route"]
    assert route.attributes["frontier.pool"] == MODEL
    assert route.attributes["frontier.replica"] == answer.headers[names.REPLICA_HEADER]
    assert "http" not in route.attributes["frontier.replica"]


def test_the_root_carries_tenant_status_and_tokens(one_trace: tuple[httpx.Response, dict]) -> None:
    answer, spans = one_trace
    root = spans["gateway.request"].attributes
    usage = answer.json()["usage"]
    assert (root["frontier.tenant"], root["http.response.status_code"]) == ("acme", 200)
    assert root["frontier.completion_tokens"] == usage["completion_tokens"] == 5
    assert spans["runtime.decode"].attributes["frontier.completion_tokens"] == 5


def test_a_streamed_answers_upstream_span_lasts_to_the_streams_end(
    runtime: RuntimeProcess, receiver: TraceReceiver, tmp_path: Path
) -> None:
    with traced_gateway(runtime, receiver, tmp_path) as gw:
        answer = complete(gw.url, stream=True)
    assert answer.status_code == 200
    spans = named(trace_of_request(receiver, answer.headers[names.REQUEST_ID_HEADER], 10))
    assert (
        spans["runtime.decode"].end_ns <= spans["gateway.upstream"].end_ns <= spans["gateway.request"].end_ns
    )


def test_a_refused_key_ends_the_trace_at_auth_with_401(
    runtime: RuntimeProcess, receiver: TraceReceiver, tmp_path: Path
) -> None:
    with traced_gateway(runtime, receiver, tmp_path) as gw:
        answer = complete(gw.url, headers={"Authorization": "Bearer sk-wrong"})
    assert answer.status_code == 401
    # A refused caller learns no request id: the trace is the one whose root answered 401.
    roots = receiver.wait_for(lambda got: any(_answered(s, 401) for s in got), timeout=20)
    root = next(s for s in roots if _answered(s, 401))
    spans = named(receiver.wait_for(lambda got: len(trace_of(got, root.trace_id)) >= 2))
    spans = {name: span for name, span in spans.items() if span.trace_id == root.trace_id}
    assert sorted(spans) == ["gateway.auth", "gateway.request"]
    assert spans["gateway.auth"].status == "error"
    assert spans["gateway.request"].attributes["http.response.status_code"] == 401


def _answered(span: ReceivedSpan, status: int) -> bool:
    return span.name == "gateway.request" and span.attributes.get("http.response.status_code") == status


def test_a_sample_ratio_of_zero_exports_nothing_from_gateway_or_runtime(
    runtime: RuntimeProcess, receiver: TraceReceiver, tmp_path: Path
) -> None:
    with traced_gateway(runtime, receiver, tmp_path, sample_ratio=0.0) as gw:
        unsampled = complete(gw.url)
    assert unsampled.status_code == 200
    # A sampled request straight to the runtime afterwards: once its spans are in, the runtime's
    # exporter has run since the unsampled request ended.
    trace_id = secrets.token_hex(16)
    direct = complete(runtime.url, headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
    assert direct.status_code == 200
    spans = receiver.wait_for(lambda got: len(trace_of(got, trace_id)) >= 5, timeout=20)
    # Both the gateway's root and the runtime's server span name the gateway's request id.
    request_id = unsampled.headers[names.REQUEST_ID_HEADER]
    assert [s.name for s in spans if s.attributes.get("frontier.request_id") == request_id] == []


def test_tracing_off_builds_no_exporter_and_loads_no_sdk(tmp_path: Path) -> None:
    # A fresh interpreter: this one has loaded the SDK for the tests above.
    script = (
        "import sys\n"
        "from frontier_gateway.serve import build_gateway\n"
        "from tests.gateway.harness import gateway_config, tenant\n"
        f"config = gateway_config({{'m': ['http://127.0.0.1:9']}}, [tenant('a', 'k', ['m'])], "
        f"__import__('pathlib').Path({str(tmp_path / 'metering.jsonl')!r}))\n"
        "gateway = build_gateway(config)\n"
        "assert gateway.tracing is None, gateway.tracing\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'))\n"
        "assert not loaded, loaded\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_demo_prints_one_requests_trace_with_every_span(
    runtime: RuntimeProcess, receiver: TraceReceiver, tmp_path: Path
) -> None:
    out = io.StringIO()
    with traced_gateway(runtime, receiver, tmp_path) as gw:
        spans = print_request_trace(gw.url, KEY, MODEL, receiver, Console(file=out, width=200))
    printed = out.getvalue()
    assert sorted(s.name for s in spans) == sorted(EXPECTED)
    assert all(name in printed for name in EXPECTED)
    assert f"trace {spans[0].trace_id}" in printed


def test_the_receiver_refuses_a_body_that_is_not_otlp_with_400_naming_it(receiver: TraceReceiver) -> None:
    answer = httpx.post(receiver.url, content=b"\xff\xffnot protobuf", timeout=10)
    assert answer.status_code == 400
    assert "not an OTLP protobuf trace export" in answer.text


def test_the_receiver_serves_only_the_traces_path(receiver: TraceReceiver) -> None:
    answer = httpx.post(receiver.url.replace("/v1/traces", "/v1/metrics"), content=b"", timeout=10)
    assert answer.status_code == 404
    assert "/v1/traces" in answer.text


def test_a_clients_own_traceparent_does_not_choose_the_trace(
    runtime: RuntimeProcess, receiver: TraceReceiver, tmp_path: Path
) -> None:
    chosen = secrets.token_hex(16)
    with traced_gateway(runtime, receiver, tmp_path) as gw:
        answer = complete(gw.url, headers={"traceparent": f"00-{chosen}-{secrets.token_hex(8)}-01"})
    spans = trace_of_request(receiver, answer.headers[names.REQUEST_ID_HEADER], 10)
    assert {s.trace_id for s in spans} != {chosen}
    assert named(spans)["gateway.request"].parent_id == ""
