"""Request traces of the runtime: one server span per generation request, continuing the caller's
W3C trace context (``traceparent``), with the request's queue wait, prefill and decode as children.

    runtime.request   arrival at the server → the last byte of the answer
      runtime.prepare   arrival → the request ready to queue (body checked, prompt tokenised)
      runtime.queue     ready → the engine's first step with the request (the wait for a slot,
                        ``frontier.admission_wait_ms``, then for a batch, ``frontier.engine_wait_ms``)
      runtime.prefill   that first step → the first token sampled (chunked prefill spans several steps)
      runtime.decode    the first token → the request finished in the engine

The children follow each other without gaps, so their durations add up to the time from arrival to
the engine's finish, inside the server span (what is left is sending the last bytes). Every span is created after the request has
ended, with explicit start and end times: the server's own clock readings and the engine's
:class:`~frontier_runtime.requests.EngineTimes`, which the engine thread writes as it goes; the
engine loop never calls OpenTelemetry.

Spans leave in batches over OTLP/HTTP (protobuf) to ``tracing.endpoint``. With no endpoint,
:meth:`RequestTracing.start` returns None and nothing of the OpenTelemetry SDK is imported: a
request then pays one ``is None`` check.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from frontier_settings.tracing import TracingSettings

from frontier_runtime.requests import EngineTimes, RequestOutput

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger("frontier_runtime.server")

DEFAULT_SERVICE = "frontier-runtime"
# The headers of W3C trace context: what a caller's span hands on.
TRACE_HEADERS = ("traceparent", "tracestate")


class RequestTracing:
    """The runtime's tracer and its exporter; one per server process."""

    def __init__(self, provider: TracerProvider, model: str) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("frontier_runtime.server")
        self.model = model
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def start(
        cls, settings: TracingSettings, model: str, environ: Mapping[str, str] = os.environ
    ) -> RequestTracing | None:
        """The tracing of a server, or None when neither ``settings`` nor ``environ`` name a
        collector (off)."""
        endpoint = settings.endpoint_in(environ)
        if not endpoint:
            return None
        return cls(settings.provider(endpoint, DEFAULT_SERVICE), model)

    def begin(self, headers: Mapping[str, str], request_id: str, arrived: float) -> RequestTrace:
        carrier = {name: headers[name] for name in TRACE_HEADERS if name in headers}
        return RequestTrace(self, carrier, request_id, arrived)

    def shutdown(self) -> None:
        """Send what is still batched, then stop the exporter."""
        self.provider.shutdown()


@dataclass
class RequestTrace:
    """What one generation request's spans are made of, noted while it runs (cheap assignments);
    the spans themselves are made by :meth:`end`."""

    tracing: RequestTracing
    carrier: dict[str, str]
    request_id: str
    arrived: float
    enqueued: float | None = None
    prepared: float | None = None
    admitted: float | None = None
    first_output: float | None = None
    engine: EngineTimes | None = None
    last: RequestOutput | None = None
    attributes: dict[str, Any] = field(default_factory=dict)

    def queued(self, enqueued: float, admitted: float | None) -> None:
        if self.prepared is None:
            self.prepared = time.monotonic()
        self.enqueued, self.admitted = enqueued, admitted

    def saw(self, out: RequestOutput) -> None:
        if self.first_output is None and out.new_token_ids:
            self.first_output = time.monotonic()
        self.engine = out.times or self.engine
        self.last = out

    def end(self, error: str | None) -> None:
        """Make and end the request's spans, now that its answer is sent (or abandoned); a
        failure here is logged, never the request's."""
        try:
            self._spans(error)
        except Exception:
            log.exception("request trace not recorded", extra={"request_id": self.request_id})

    def _spans(self, error: str | None) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        ended = time.monotonic()
        at = _clock()
        tracer = self.tracing.tracer
        parent = self.tracing.propagator.extract(self.carrier)
        root = tracer.start_span(
            "runtime.request", context=parent, kind=SpanKind.SERVER, start_time=at(self.arrived)
        )
        root.set_attributes(
            {"frontier.request_id": self.request_id, "frontier.model": self.tracing.model, **self.attributes}
        )
        if self.last is not None:
            root.set_attributes(
                {
                    "frontier.prompt_tokens": self.last.prompt_tokens,
                    "frontier.completion_tokens": self.last.completion_tokens,
                    "frontier.cached_prompt_tokens": self.last.cached_prompt_tokens,
                    "frontier.finish_reason": self.last.finish_reason or "",
                }
            )
        if error:
            root.set_status(Status(StatusCode.ERROR, error))
            root.set_attribute("frontier.error", error)
        for name, start, end, attributes in self._phases(ended):
            child = tracer.start_span(
                name, context=_within(root), kind=SpanKind.INTERNAL, start_time=at(start)
            )
            child.set_attributes(attributes)
            child.end(end_time=at(end))
        root.end(end_time=at(ended))

    def _phases(self, ended: float) -> list[tuple[str, float, float, dict[str, Any]]]:
        """(name, start, end, attributes) of queue, prefill and decode, back to back; a phase the
        request never reached is left out."""
        if self.enqueued is None or self.prepared is None:
            return []
        times = self.engine
        scheduled = max(self.prepared, (times.scheduled if times else None) or self.admitted or ended)
        queue: dict[str, Any] = {}
        if self.admitted is not None:
            queue["frontier.admission_wait_ms"] = round((self.admitted - self.enqueued) * 1000, 3)
        if times is not None and times.scheduled is not None:
            queue["frontier.engine_wait_ms"] = round((times.scheduled - times.added) * 1000, 3)
        phases = [
            ("runtime.prepare", self.arrived, self.prepared, {}),
            ("runtime.queue", self.prepared, scheduled, queue),
        ]
        if times is None or times.scheduled is None:
            return phases
        first = times.first_token or self.first_output
        finished = times.finished or ended
        last = self.last
        phases.append(
            (
                "runtime.prefill",
                scheduled,
                first or finished,
                {
                    "frontier.prompt_tokens": last.prompt_tokens if last else 0,
                    "frontier.cached_prompt_tokens": last.cached_prompt_tokens if last else 0,
                },
            )
        )
        if first is not None:
            phases.append(
                (
                    "runtime.decode",
                    first,
                    max(first, finished),
                    {"frontier.completion_tokens": last.completion_tokens if last else 0},
                )
            )
        return phases


def _within(span: Any) -> Any:
    from opentelemetry.trace import set_span_in_context

    return set_span_in_context(span)


def _clock() -> Any:
    """``time.monotonic()`` readings to the epoch nanoseconds spans carry (one offset per request)."""
    offset = time.time_ns() - time.monotonic_ns()

    def at(monotonic: float) -> int:
        return int(monotonic * 1e9) + offset

    return at
