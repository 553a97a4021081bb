"""The local stack's trace receiver: OTLP over HTTP (``POST /v1/traces``, protobuf), kept and written.

A cloud stack sends its spans to the collector its ``tracing.endpoint`` names. On this machine no
OpenTelemetry Collector binary can be installed (Debian packages none; only its Go modules exist),
so the local stack runs this small receiver instead: it decodes the same wire format with
``opentelemetry-proto`` (the package OpenTelemetry's exporter itself builds its requests with),
keeps each span as a :class:`ReceivedSpan` and appends it to a JSON-lines file that the demo and
tests read. Every process of the local stack finds it through the standard
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` variable (:func:`environment`), as boto3 finds moto through
``AWS_ENDPOINT_URL``; ``local.up`` runs it on a free loopback port kept in its service record.

    python -m frontier.targets.local.traces --port 4318 --out spans.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import json
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SERVICE = "traces"
# OTLP/HTTP's registered port: the receiver's default when run by hand (the local stack picks a
# free one, as several stacks may run side by side).
PORT = 4318
PATH = "/v1/traces"
SPANS_FILE = "traces/spans.jsonl"
# A request body larger than this is refused (413) before it is read.
MAX_BODY_BYTES = 16 * 1024 * 1024
SPAN_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUS_CODES = {0: "unset", 1: "ok", 2: "error"}


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver got it; ids in lowercase hex, times in epoch nanoseconds."""

    trace_id: str
    span_id: str
    parent_id: str  # empty for a root span
    name: str
    service: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: str

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> ReceivedSpan:
        return cls(**json.loads(line))


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one OTLP ``ExportTraceServiceRequest`` (protobuf)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        name=span.name,
                        service=service,
                        kind=SPAN_KINDS.get(span.kind, str(span.kind)),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=_attributes(span.attributes),
                        status=STATUS_CODES.get(span.status.code, str(span.status.code)),
                    )
                )
    return spans


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: Any) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which) if which else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: TraceReceiver

    def log_message(self, *args: object) -> None:
        pass  # one line per export would drown the receiver's own log

    def do_POST(self) -> None:
        if self.path != PATH:
            self._answer(404, f"only {PATH} is served here")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._answer(413, f"body of {length} bytes exceeds {MAX_BODY_BYTES}")
            return
        body = self.rfile.read(length)
        encoding = (self.headers.get("Content-Encoding") or "").lower()
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            spans = decode(body)
        except Exception as exc:  # noqa: BLE001 - any undecodable body is the sender's 400
            self._answer(400, f"not an OTLP protobuf trace export: {type(exc).__name__}: {exc}")
            return
        self.server.keep(spans)
        # An empty ExportTraceServiceResponse: zero bytes of protobuf.
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _answer(self, status: int, message: str) -> None:
        payload = message.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class TraceReceiver(ThreadingHTTPServer):
    """The receiver on a real socket, serving from its own thread; ``out`` gets one JSON line per span."""

    daemon_threads = True

    def __init__(self, address: str = "127.0.0.1", port: int = 0, out: Path | None = None) -> None:
        super().__init__((address, port), _Handler)
        self.out = out
        self.spans: list[ReceivedSpan] = []
        self.exports = 0
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self.serve_forever, name="trace-receiver", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}{PATH}"

    def start(self) -> TraceReceiver:
        self._thread.start()
        return self

    def close(self) -> None:
        self.shutdown()
        self.server_close()

    def keep(self, spans: list[ReceivedSpan]) -> None:
        with self._changed:
            self.spans.extend(spans)
            self.exports += 1
            if self.out is not None and spans:
                with self.out.open("a") as out:
                    out.write("".join(span.to_json() + "\n" for span in spans))
            self._changed.notify_all()

    def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout: float = 10.0
    ) -> list[ReceivedSpan]:
        """The spans so far, once ``done(spans)`` holds; TimeoutError naming what came otherwise."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not done(self.spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    got = sorted({(s.service, s.name) for s in self.spans})
                    raise TimeoutError(f"spans not complete after {timeout:g} s; received: {got}")
                self._changed.wait(left)
            return list(self.spans)


def read_spans(path: Path) -> list[ReceivedSpan]:
    """The spans a receiver wrote to ``path`` (none yet: an empty list)."""
    if not path.exists():
        return []
    return [ReceivedSpan.from_json(line) for line in path.read_text().splitlines() if line.strip()]


def trace_of(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    """One trace's spans in the order they started."""
    return sorted((s for s in spans if s.trace_id == trace_id), key=lambda s: (s.start_ns, s.end_ns))


# --- on the local stack ------------------------------------------------------------------------


def endpoint(address: str = "127.0.0.1", port: int = PORT) -> str:
    return f"http://{address}:{port}{PATH}"


def environment(port: int) -> dict[str, str]:
    """What a process of the local stack needs in its environment to send its spans here."""
    return {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint(port=port)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=PORT, help=f"0..65535 (default {PORT})")
    parser.add_argument("--out", type=Path, required=True, help="the JSON-lines file spans are appended to")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: must be within 0..65535")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    receiver = TraceReceiver(args.host, args.port, args.out)
    print(f"receiving OTLP traces on {receiver.url}, writing {args.out}", flush=True)
    try:
        receiver.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        receiver.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
