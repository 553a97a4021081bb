"""The ``tracing:`` section the runtime and the gateway share: where spans go, and how many.

Declared once here (both read it, and the stack's ``runtime`` and ``gateway`` sections inherit it
from their models); each process builds its exporter from it at start. No endpoint (in the settings
or in ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``): tracing is off and nothing of the OpenTelemetry SDK
is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ENDPOINT_VARIABLE", "TracingSettings"]

# The standard variable of OpenTelemetry's exporters. Where a stack names no endpoint, the host may
# (as AWS_ENDPOINT_URL points boto3 at moto): the local stack points every process at its receiver.
ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENDPOINT_PATTERN = r"^$|^https?://[A-Za-z0-9.\[\]:_-]+(:[0-9]{1,5})?(/[A-Za-z0-9._/-]*)?$"


class TracingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str = Field(
        default="",
        pattern=ENDPOINT_PATTERN,
        description="The collector's OTLP/HTTP traces URL, e.g. http://10.0.0.5:4318/v1/traces; empty: off.",
    )
    sample_ratio: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Share of new traces kept. The gateway starts every trace; a runtime follows the "
        "trace context it receives and applies this only to requests sent to it directly.",
    )
    service_name: str = Field(
        default="",
        pattern=r"^$|^[A-Za-z0-9._-]{1,128}$",
        description="service.name on every span; empty: frontier-runtime or frontier-gateway.",
    )
    batch_delay_ms: int = Field(
        default=1000,
        ge=10,
        le=60_000,
        description="Longest a finished span waits before it is sent (spans go in batches, off the request path).",
    )

    def endpoint_in(self, environ: Mapping[str, str]) -> str:
        """Where spans go: ``endpoint``, else the standard variable in ``environ``; empty: off.
        A malformed variable is refused at start, naming it, rather than failing every export."""
        if self.endpoint:
            return self.endpoint
        found = environ.get(ENDPOINT_VARIABLE, "").strip()
        if not re.match(ENDPOINT_PATTERN, found):
            raise ValueError(
                f"{ENDPOINT_VARIABLE}={found!r}: must be an http(s) URL such as "
                "http://127.0.0.1:4318/v1/traces, or empty (tracing off)"
            )
        return found

    def provider(self, endpoint: str, default_service: str) -> Any:
        """A tracer provider of its own (never the global one, so two servers in one process keep
        their own exporters) exporting to ``endpoint`` over OTLP/HTTP, sampling ``sample_ratio`` of
        new traces and following a caller's decision. The SDK is imported here, only when on."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        provider = TracerProvider(
            resource=Resource.create({"service.name": self.service_name or default_service}),
            sampler=ParentBased(TraceIdRatioBased(self.sample_ratio)),
        )
        exporter = OTLPSpanExporter(endpoint=endpoint, timeout=10)
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=self.batch_delay_ms))
        return provider
