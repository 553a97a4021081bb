"""Request traces of the gateway: where a request's time goes before and around the runtime.

    gateway.request    the request's arrival → its answer's end (a stream's last byte); always a
                       new root: a client's own ``traceparent`` is not followed, or a tenant could
                       choose which of its requests are sampled, and their trace ids
      gateway.auth       the tenant's key checked
      gateway.quota      the tenant's limits checked and its estimate taken (a refusal: 429)
      gateway.hold       waiting in the pool's hold queue for a ready replica (only when it did)
      gateway.route      one replica chosen (pool, the replica's opaque id, the attempt)
      gateway.upstream   one attempt at that replica: headers and body for a non-streamed answer,
                         the whole stream for a streamed one; it carries ``traceparent`` to the
                         runtime, whose ``runtime.request`` span is its child

Attributes name the tenant, model, priority, the replica's opaque id and the tokens used. The
upstream span also names the replica's internal URL (``server.address``/``url.full``): spans go only
to the operator's own collector, never back to a client (answers carry the opaque id only).

Spans leave in batches over OTLP/HTTP (protobuf) to ``tracing.endpoint``, else to the standard
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (how the local stack points every process at its receiver).
With neither, :meth:`GatewayTracing.start` returns None, nothing of the OpenTelemetry SDK is
imported, and a request pays one ``is None`` check per step.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from frontier_settings.tracing import TracingSettings

from frontier_gateway.errors import GatewayError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

DEFAULT_SERVICE = "frontier-gateway"


class GatewayTracing:
    """The gateway's tracer and exporter; one per gateway process."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("frontier_gateway")
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def start(
        cls, settings: TracingSettings, environ: Mapping[str, str] = os.environ
    ) -> GatewayTracing | None:
        endpoint = settings.endpoint_in(environ)
        if not endpoint:
            return None
        return cls(settings.provider(endpoint, DEFAULT_SERVICE))

    def begin(self, request_id: str, path: str) -> CallTrace:
        """The root span of one request: a new trace, sampled by ``sample_ratio``."""
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind

        root = self.tracer.start_span("gateway.request", context=Context(), kind=SpanKind.SERVER)
        root.set_attributes({"frontier.request_id": request_id, "url.path": path})
        return CallTrace(self, root)

    def shutdown(self) -> None:
        """Send what is still batched, then stop the exporter."""
        self.provider.shutdown()


@dataclass
class CallTrace:
    """One request's spans: the root, its steps, and the upstream attempt in progress."""

    tracing: GatewayTracing
    root: Span
    upstream: Span | None = None
    ended: bool = False
    attributes: dict[str, Any] = field(default_factory=dict)

    def _context(self) -> Any:
        from opentelemetry.trace import set_span_in_context

        return set_span_in_context(self.root)

    @contextmanager
    def step(self, name: str) -> Iterator[Span]:
        """A child span around one step; a refusal raised inside ends the step and the request."""
        span = self.tracing.tracer.start_span(name, context=self._context())
        try:
            yield span
        except GatewayError as refusal:
            _failed(span, f"{refusal.status} {refusal.code}")
            span.end()
            self.end(refusal.status)
            raise
        except BaseException:
            span.end()
            raise
        span.end()

    def begin_upstream(self, replica_id: str, url: str, headers: dict[str, str]) -> None:
        """The span of one attempt at a replica; its context goes upstream in ``headers``."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        span = self.tracing.tracer.start_span(
            "gateway.upstream", context=self._context(), kind=SpanKind.CLIENT
        )
        span.set_attributes({"frontier.replica": replica_id, "server.address": url, "url.full": url})
        self.tracing.propagator.inject(headers, context=set_span_in_context(span))
        self.upstream = span

    def end_upstream(self, outcome: int | None) -> None:
        """End the attempt in progress: ``outcome`` is the replica's status, 0 for a broken
        connection, None for a client that left."""
        span, self.upstream = self.upstream, None
        if span is None:
            return
        if outcome:
            span.set_attribute("http.response.status_code", outcome)
        if outcome == 0:
            _failed(span, "replica unreachable or failed mid-answer")
        elif outcome is not None and outcome >= 500:
            _failed(span, f"replica answered {outcome}")
        span.end()

    def end(self, status: int, usage: Mapping[str, Any] | None = None, replica_id: str = "") -> None:
        """End the request's root span (once) with its status and the tokens it used."""
        if self.ended:
            return
        self.ended = True
        self.end_upstream(None)
        root = self.root
        root.set_attributes({**self.attributes, "http.response.status_code": status})
        if replica_id:
            root.set_attribute("frontier.replica", replica_id)
        if usage:
            root.set_attributes(
                {
                    "frontier.prompt_tokens": int(usage.get("prompt_tokens") or 0),
                    "frontier.completion_tokens": int(usage.get("completion_tokens") or 0),
                }
            )
        if status >= 500:
            _failed(root, f"answered {status}")
        root.end()


def _failed(span: Span, why: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, why))
