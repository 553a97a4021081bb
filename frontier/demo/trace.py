"""The demo's trace: one request through the gateway, and where its time went, span by span.

The gateway and the runtimes of the local stack send their spans to the stack's receiver
(:mod:`frontier.targets.local.traces`), which appends them to ``<state_dir>/traces/spans.jsonl``.
:func:`request_trace` sends one chat completion, finds its trace by the request id the gateway
answered with, waits for the runtime's spans to arrive, and returns them; :func:`trace_table` lays
them out as a table (span, parent, start offset, duration, key attributes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
from frontier_hostside import names
from rich.console import Console
from rich.table import Table

from frontier.errors import FrontierError
from frontier.targets.local.traces import ReceivedSpan, TraceReceiver, read_spans, trace_of

# The spans one served request makes (gateway.hold only when it waited for a replica).
EXPECTED = (
    "gateway.request",
    "gateway.auth",
    "gateway.quota",
    "gateway.route",
    "gateway.upstream",
    "runtime.request",
    "runtime.prepare",
    "runtime.queue",
    "runtime.prefill",
    "runtime.decode",
)
# Attributes worth a column's room, in this order; the rest stay in the receiver's file.
SHOWN = (
    "frontier.tenant",
    "frontier.model",
    "frontier.pool",
    "frontier.replica",
    "http.response.status_code",
    "frontier.admission_wait_ms",
    "frontier.engine_wait_ms",
    "frontier.prompt_tokens",
    "frontier.cached_prompt_tokens",
    "frontier.completion_tokens",
    "frontier.finish_reason",
)
# Batches leave the processes about once a second (tracing.batch_delay_ms).
WAIT_S = 15.0


def request_trace(
    gateway_url: str, key: str, model: str, receiver: Path | TraceReceiver, timeout_s: float = WAIT_S
) -> list[ReceivedSpan]:
    """Send one chat completion through the gateway; return its trace once every span has come."""
    answer = httpx.post(
        gateway_url + names.CHAT_COMPLETIONS_PATH,
        json={"model": model, "messages": [{"role": "user", "content": "trace me"}], "max_tokens": 8},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    if answer.status_code != 200:
        raise FrontierError(f"the traced request failed: HTTP {answer.status_code}: {answer.text[:300]}")
    request_id = answer.headers[names.REQUEST_ID_HEADER]
    spans_now = _source(receiver)
    deadline = time.monotonic() + timeout_s
    while True:
        spans = _trace_of_request(spans_now(), request_id)
        if {s.name for s in spans} >= set(EXPECTED):
            return spans
        if time.monotonic() > deadline:
            got = sorted({s.name for s in spans})
            raise FrontierError(
                f"the trace of request {request_id} is incomplete after {timeout_s:g} s: got {got}, "
                f"expected {list(EXPECTED)} (are the gateway and runtimes sending to the receiver?)"
            )
        time.sleep(0.2)


def _source(receiver: Path | TraceReceiver) -> Callable[[], list[ReceivedSpan]]:
    if isinstance(receiver, TraceReceiver):
        return lambda: list(receiver.spans)
    return lambda: read_spans(receiver)


def _trace_of_request(spans: list[ReceivedSpan], request_id: str) -> list[ReceivedSpan]:
    root = next(
        (
            s
            for s in spans
            if s.name == "gateway.request" and s.attributes.get("frontier.request_id") == request_id
        ),
        None,
    )
    return [] if root is None else trace_of(spans, root.trace_id)


def trace_table(spans: list[ReceivedSpan]) -> Table:
    """One row per span, parents before children, offsets from the trace's first span."""
    start = min(s.start_ns for s in spans)
    by_id = {s.span_id: s for s in spans}
    table = Table(title=f"trace {spans[0].trace_id}", title_justify="left")
    for column in ("span", "parent", "start ms", "duration ms", "attributes"):
        table.add_column(column, justify="right" if "ms" in column else "left")
    for span, depth in _tree(spans):
        parent = by_id.get(span.parent_id)
        shown = [f"{k.removeprefix('frontier.')}={span.attributes[k]}" for k in SHOWN if k in span.attributes]
        table.add_row(
            "  " * depth + span.name,
            parent.name if parent else "",
            f"{(span.start_ns - start) / 1e6:.1f}",
            f"{span.duration_ms:.1f}",
            " ".join(shown),
        )
    return table


def _tree(spans: list[ReceivedSpan]) -> list[tuple[ReceivedSpan, int]]:
    """The spans depth first, each parent's children in the order they started."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[ReceivedSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_ns):
        children.setdefault(span.parent_id if span.parent_id in ids else "", []).append(span)
    ordered: list[tuple[ReceivedSpan, int]] = []

    def visit(parent: str, depth: int) -> None:
        for child in children.get(parent, []):
            ordered.append((child, depth))
            visit(child.span_id, depth + 1)

    visit("", 0)
    return ordered


def print_request_trace(
    gateway_url: str, key: str, model: str, receiver: Path | TraceReceiver, console: Console | None = None
) -> list[ReceivedSpan]:
    """The demo's step: one request's trace, printed as a table."""
    spans = request_trace(gateway_url, key, model, receiver)
    (console or Console()).print(trace_table(spans))
    return spans
