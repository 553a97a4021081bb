"""Request traces of the runtime: a real server over the real engine sends its spans over OTLP/HTTP
to the local stack's real receiver on a loopback socket."""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from frontier_runtime.config import ConfigError
from frontier_runtime.requests import RequestOutput, SamplingParams
from frontier_runtime.server.tracing import RequestTracing
from frontier_settings.tracing import TracingSettings

from frontier.targets.local.traces import ReceivedSpan, TraceReceiver, trace_of
from tests.runtime.server.server_harness import MODEL, RunningServer, runtime_config

PHASES = ("runtime.prepare", "runtime.queue", "runtime.prefill", "runtime.decode")


@pytest.fixture
def receiver() -> Iterator[TraceReceiver]:
    receiver = TraceReceiver().start()
    yield receiver
    receiver.close()


@pytest.fixture
def traced(serve: Any, receiver: TraceReceiver) -> RunningServer:
    return serve(tracing__endpoint=receiver.url, tracing__batch_delay_ms=20)


def caller_context(sampled: bool = True) -> tuple[str, str, dict[str, str]]:
    """A trace id, a parent span id and the ``traceparent`` header of a caller's span."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, {"traceparent": f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"}


def complete(srv: RunningServer, headers: dict[str, str], max_tokens: int = 6, **body: Any) -> dict:
    answer = httpx.post(
        srv.url + "/v1/completions",
        json={"model": MODEL, "prompt": "hello there", "max_tokens": max_tokens, "ignore_eos": True, **body},
        headers=headers,
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return answer.json() if not body.get("stream") else {}


def spans_of_trace(receiver: TraceReceiver, trace_id: str, count: int) -> list[ReceivedSpan]:
    spans = receiver.wait_for(lambda got: len(trace_of(got, trace_id)) >= count)
    return trace_of(spans, trace_id)


def by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {span.name: span for span in spans}


def test_the_server_span_continues_the_callers_trace(traced: RunningServer, receiver: TraceReceiver) -> None:
    trace_id, parent, headers = caller_context()
    complete(traced, headers)
    server = by_name(spans_of_trace(receiver, trace_id, 5))["runtime.request"]
    assert (server.parent_id, server.kind, server.service) == (parent, "server", "frontier-runtime")


def test_prepare_queue_prefill_and_decode_are_children_of_the_server_span(
    traced: RunningServer, receiver: TraceReceiver
) -> None:
    trace_id, _, headers = caller_context()
    complete(traced, headers)
    spans = by_name(spans_of_trace(receiver, trace_id, 5))
    assert sorted(spans) == sorted(("runtime.request", *PHASES))
    assert {spans[name].parent_id for name in PHASES} == {spans["runtime.request"].span_id}


def test_the_phases_follow_each_other_and_add_up_within_the_server_span(
    traced: RunningServer, receiver: TraceReceiver
) -> None:
    trace_id, _, headers = caller_context()
    complete(traced, headers, max_tokens=12)
    spans = by_name(spans_of_trace(receiver, trace_id, 5))
    phases = [spans[name] for name in PHASES]
    server = spans["runtime.request"]
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(phases))
    assert server.start_ns == phases[0].start_ns and phases[-1].end_ns <= server.end_ns
    assert sum(phase.duration_ms for phase in phases) <= server.duration_ms
    assert all(spans[name].duration_ms > 0 for name in ("runtime.prefill", "runtime.decode"))


def test_the_spans_carry_the_requests_token_counts(traced: RunningServer, receiver: TraceReceiver) -> None:
    trace_id, _, headers = caller_context()
    usage = complete(traced, headers, max_tokens=7)["usage"]
    spans = by_name(spans_of_trace(receiver, trace_id, 5))
    assert spans["runtime.prefill"].attributes["frontier.prompt_tokens"] == usage["prompt_tokens"]
    assert spans["runtime.decode"].attributes["frontier.completion_tokens"] == usage["completion_tokens"] == 7
    assert spans["runtime.request"].attributes["frontier.finish_reason"] == "length"


def test_a_streamed_request_is_traced_like_a_unary_one(
    traced: RunningServer, receiver: TraceReceiver
) -> None:
    trace_id, _, headers = caller_context()
    complete(traced, headers, stream=True)
    spans = by_name(spans_of_trace(receiver, trace_id, 5))
    assert spans["runtime.decode"].attributes["frontier.completion_tokens"] == 6


def test_a_caller_that_does_not_sample_gets_no_runtime_spans(
    traced: RunningServer, receiver: TraceReceiver
) -> None:
    unsampled, _, headers = caller_context(sampled=False)
    complete(traced, headers)
    sampled, _, later = caller_context()
    complete(traced, later)
    spans = receiver.wait_for(lambda got: len(trace_of(got, sampled)) >= 5)
    assert trace_of(spans, unsampled) == []


def test_a_sample_ratio_of_zero_traces_no_request_that_starts_a_trace(
    serve: Any, receiver: TraceReceiver
) -> None:
    srv = serve(tracing__endpoint=receiver.url, tracing__batch_delay_ms=20, tracing__sample_ratio=0.0)
    complete(srv, {})
    # A request under a sampled caller still is: its spans prove the exporter ran meanwhile.
    sampled, _, headers = caller_context()
    complete(srv, headers)
    spans = receiver.wait_for(lambda got: len(trace_of(got, sampled)) >= 5)
    assert {span.trace_id for span in spans} == {sampled}


def test_tracing_off_makes_no_tracer_and_loads_no_sdk(tmp_path: Any) -> None:
    # A fresh interpreter: this one has loaded the SDK for the tests above.
    script = (
        "import sys\n"
        "from frontier_runtime.server.app import create_app\n"
        "from frontier_runtime.server.serve import new_state\n"
        "from tests.runtime.server.server_harness import runtime_config\n"
        f"app = create_app(new_state(runtime_config({str(tmp_path)!r})))\n"
        "assert app.app.state.tracing is None, app.app.state.tracing\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'))\n"
        "assert not loaded, loaded\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_sample_ratio_outside_zero_to_one_is_refused_naming_the_field(tiny_model: Any) -> None:
    with pytest.raises(ConfigError, match=r"tracing\.sample_ratio.*1\.5"):
        runtime_config(tiny_model, tracing__sample_ratio=1.5)


def test_a_malformed_endpoint_variable_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT='localhost:4318'.*http"):
        RequestTracing.start(
            TracingSettings(), MODEL, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "localhost:4318"}
        )


def test_the_stacks_endpoint_wins_over_the_variable() -> None:
    settings = TracingSettings(endpoint="http://10.0.0.5:4318/v1/traces")
    assert settings.endpoint_in(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}
    ) == ("http://10.0.0.5:4318/v1/traces")


def test_the_engine_stamps_each_requests_timeline_in_order_on_every_output(engine: Any) -> None:
    async def run() -> list[RequestOutput]:
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        return [out async for out in engine.submit(secrets.token_hex(8), [5, 6, 7, 8], params)]

    outputs = asyncio.run(run())
    times = outputs[-1].times
    assert times is not None and all(out.times is times for out in outputs)
    assert times.scheduled is not None and times.first_token is not None and times.finished is not None
    assert times.added <= times.scheduled <= times.first_token <= times.finished
