"""Forwarding one admitted request to a replica of its model, streaming the answer back.

A request moves to another replica only while nothing has been sent to the client: on a refused
or broken connection, on a retryable status (429 queue full, 502, 503 draining, 504), or when a
streaming replica dies before its first data event (the gateway holds the response headers back
until that event arrives). Once a byte has gone out, a failure ends the stream with an error event.

Every request ends in ``Call.finish`` exactly once: the tenant's tokens are settled with the
runtime's usage, a metering record is written and the per-tenant metrics move.

Requests go upstream through the gateway's own lean client (``upstream.py``): connections to a
replica are kept alive and reused across requests, and each request leaves in one write.

Each attempt's outcome goes to the replica's circuit breaker; when no replica of the pool is
available (none ready, or every ready one's breaker open) the answer is an immediate 503 whose
``Retry-After`` is the soonest end of a cool-off — unless the pool has a hold queue (``hold.py``):
then the request waits there for a replica to become ready, within the queue's bounds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from frontier_hostside import names
from frontier_settings.openai_errors import error_body
from starlette.responses import Response, StreamingResponse

from frontier_gateway.errors import GatewayError
from frontier_gateway.hold import ClientLeft
from frontier_gateway.metering import MeterRecord, Sink
from frontier_gateway.metrics import Metrics
from frontier_gateway.migration import Migrator, Outcome, assemble
from frontier_gateway.pools import Pool, Replica
from frontier_gateway.quotas import Grant
from frontier_gateway.tenants import Tenant, UpstreamKeys
from frontier_gateway.tracing import CallTrace
from frontier_gateway.upstream import Answer, Upstream, UpstreamError

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("frontier_gateway.proxy")

RETRYABLE = frozenset({429, 502, 503, 504})

# Hop-by-hop and length headers are the gateway's own to set.
DROPPED = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "date", "server"}
)


@dataclass
class Call:
    """One admitted request and what the gateway learns while answering it."""

    request_id: str  # the gateway's own
    client_request_id: str | None
    tenant: Tenant
    model: str
    priority: str
    path: str
    body: bytes
    stream: bool
    client_wants_usage: bool
    grant: Grant
    affinity_key: str | None
    headers: dict[str, str]  # sent to the client with the answer (rate limits, request id)
    started: float = field(default_factory=time.monotonic)
    ttft_s: float | None = None
    finished: bool = False
    # Returns when the client disconnects (the ASGI receive channel): a held request then leaves
    # its pool's hold queue at once.
    until_disconnect: Callable[[], Awaitable[object]] | None = None
    trace: CallTrace | None = None  # None: not traced (tracing off)
    kv_keys: list[int] | None = None  # the prompt's block keys, for a pool with KV routing
    # What goes upstream (``migration.py``): a non-streamed request may go as a stream.
    upstream_body: bytes | None = None
    upstream_stream: bool = False


class Proxy:
    def __init__(
        self,
        upstream: Upstream,
        metrics: Metrics,
        sink: Sink,
        retries: int,
        upstream_auth: UpstreamKeys,
        migration_limit: int = 0,
    ) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.sink = sink
        self.retries = retries
        self.upstream_auth = upstream_auth
        self.migrator = Migrator(upstream, metrics, migration_limit, upstream_auth)

    async def forward(self, call: Call, pool: Pool) -> Response:
        if pool.disaggregated is not None:  # prefill, then decode (disaggregation.py)
            handed = await pool.disaggregated.forward(
                call, self.upstream, self.upstream_auth.get(pool.name), self.forward
            )
            if handed is not None:
                return handed
        tried: list[str] = []
        last: Response | None = None
        self.metrics.in_flight.labels(call.tenant.name).inc()
        call.upstream_body, call.upstream_stream = self.migrator.upstream_body(call)
        try:
            if pool.hold is not None and not pool.available():
                try:
                    with _step(call, "gateway.hold"):
                        await pool.hold.wait(
                            call.priority, lambda: bool(pool.available()), call.until_disconnect
                        )
                except GatewayError as refusal:
                    self._finish(call, refusal.status, None, "")
                    return refusal.response(call.headers)
                except ClientLeft:
                    self._finish(call, 499, None, "")
                    return Response(status_code=499)
            for attempt in range(self.retries + 1):
                with _step(call, "gateway.route") as route:
                    replica = pool.choose(call.affinity_key, tried, call.kv_keys)
                    if route is not None:
                        route.set_attributes(
                            {
                                "frontier.pool": pool.name,
                                "frontier.attempt": attempt,
                                "frontier.replica": replica.id if replica is not None else "",
                                "frontier.affinity": call.affinity_key is not None,
                            }
                        )
                if replica is None:
                    break
                if attempt:
                    self.metrics.retries.labels(call.model).inc()
                tried.append(replica.url)
                answer = await self._try(call, replica, pool)
                if answer is None:
                    continue  # nothing reached the client: the next replica gets it
                if isinstance(answer, StreamingResponse):
                    return answer  # the stream finishes the call when it ends
                if answer.status_code in RETRYABLE and attempt < self.retries and pool.available(tried):
                    last = answer
                    continue
                self._finish(call, answer.status_code, _usage_of(answer.body), replica.url)
                await call.grant.wait_settled()
                return answer
        except asyncio.CancelledError:
            self._finish(call, 499, None, "")  # the client left while the request was forwarded
            raise
        except BaseException:
            self._finish(call, 500, None, "")
            raise
        if last is not None:
            self._finish(call, last.status_code, None, tried[-1])
            return last
        self._finish(call, 503, None, tried[-1] if tried else "")
        return _no_replica(call, pool, tried).response(call.headers)

    async def _try(self, call: Call, replica: Replica, pool: Pool) -> Response | None:
        """The answer of ``replica``, or None when it failed before anything could be sent."""
        headers = {
            "host": replica.host,
            "content-type": "application/json",
            names.REQUEST_ID_HEADER: call.request_id,
        }
        key = self.upstream_auth.get(pool.name)  # the key of the runtimes of the pool that takes it
        if key:
            headers["authorization"] = f"Bearer {key}"
        migrating = self.migrator.enabled and call.upstream_stream
        if migrating:
            headers[names.TOKEN_IDS_HEADER] = "1"
        if call.trace is not None:
            call.trace.begin_upstream(replica.id, replica.url, headers)
        replica.outstanding += 1
        handed_over = False
        outcome: int | None = None  # for the breaker: a status, 0 for a failed connection
        try:
            try:
                upstream = await self.upstream.post(
                    replica.url + call.path, headers, call.upstream_body or call.body
                )
            except UpstreamError as exc:
                _failed(replica, "replica unreachable", exc)
                outcome = 0
                return None
            try:
                if call.upstream_stream and upstream.status == 200 and _event_stream(upstream, call):
                    events = upstream.events()
                    held = await _until_first_data(events)
                    if held is None:
                        await upstream.aclose()
                        outcome = 0
                        replica.mark_down()
                        return None
                    call.ttft_s = time.monotonic() - call.started
                    outcome = 200
                    handed_over = True
                    if migrating:
                        return await self._migrating(call, pool, replica, upstream, held, events)
                    return StreamingResponse(
                        self._relay(call, replica, upstream, held, events),
                        status_code=200,
                        headers=self._client_headers(call, upstream, replica),
                        media_type="text/event-stream",
                    )
                content = await upstream.read()
                outcome = upstream.status
            except UpstreamError as exc:
                _failed(replica, "replica failed mid-answer", exc)
                outcome = 0
                return None
            finally:
                if not handed_over:
                    await upstream.aclose()
            return Response(
                content,
                status_code=upstream.status,
                headers=self._client_headers(call, upstream, replica),
            )
        finally:
            replica.breaker.record(outcome)
            if not handed_over:
                replica.outstanding -= 1
                if call.trace is not None:
                    call.trace.end_upstream(outcome)

    async def _migrating(
        self,
        call: Call,
        pool: Pool,
        replica: Replica,
        upstream: Answer,
        held: list[bytes],
        events: AsyncIterator[list[bytes]],
    ) -> Response:
        """The answer of a generation that moves to another replica if its own fails
        (``migration.py``): streamed on, or assembled into one JSON answer for a non-streamed request."""
        outcome = Outcome()

        def open_hop(hop: Replica, headers: dict[str, str]) -> None:
            hop.outstanding += 1
            if call.trace is not None:
                call.trace.begin_upstream(hop.id, hop.url, headers)

        def close_hop(hop: Replica, status: int | None) -> None:
            hop.outstanding -= 1
            if status is not None and status != 200:
                hop.breaker.record(status)
            if call.trace is not None:
                call.trace.end_upstream(status)

        relay = self.migrator.relay(call, pool, replica, upstream, held, events, outcome, open_hop, close_hop)
        if not call.stream:
            tail = b"".join([part async for part in relay])
            status, body = assemble(outcome.chunks, tail)
            outcome.status = status  # forward() meters it
            return Response(
                json.dumps(body, ensure_ascii=False).encode(),
                status_code=status,
                headers={**call.headers, names.REPLICA_HEADER: replica.id},
                media_type="application/json",
            )
        return StreamingResponse(
            self._metered(call, relay, outcome),
            status_code=200,
            headers=self._client_headers(call, upstream, replica),
            media_type="text/event-stream",
        )

    async def _metered(
        self, call: Call, relay: AsyncGenerator[bytes, None], outcome: Outcome
    ) -> AsyncIterator[bytes]:
        try:
            async for part in relay:
                yield part
        finally:
            await relay.aclose()
            self._finish(call, outcome.status, outcome.progress.usage, outcome.replica)

    def _client_headers(self, call: Call, upstream: Answer, replica: Replica) -> dict[str, str]:
        passed = {name: value for name, value in upstream.headers if name not in DROPPED}
        return {**passed, **call.headers, names.REPLICA_HEADER: replica.id}

    async def _relay(
        self,
        call: Call,
        replica: Replica,
        upstream: Answer,
        held: list[bytes],
        events: AsyncIterator[list[bytes]],
    ) -> AsyncIterator[bytes]:
        usage: dict[str, Any] | None = None
        status = 200
        try:
            # The events that arrived together leave together: one write to the client, not one each.
            batch: list[bytes] | None = held
            while batch is not None:
                kept = []
                for event in batch:
                    data = _event_json(event)
                    usage = _usage_in(data) or usage
                    if _keep(data, call.client_wants_usage):
                        kept.append(event)
                if kept:
                    yield b"".join(kept)
                batch = await anext(events, None)
        except UpstreamError as exc:
            # Bytes already reached the client: the request cannot move; say so in the stream.
            status = 502
            replica.breaker.record(0)
            _failed(replica, "replica failed mid-stream", exc)
            message = f"the replica serving this stream failed: {type(exc).__name__}"
            error = error_body(message, status, code="upstream_failed")
            yield f"data: {json.dumps(error)}\n\n".encode()
        except BaseException:
            status = 499  # the client left
            raise
        finally:
            replica.outstanding -= 1
            await upstream.aclose()
            if call.trace is not None:
                call.trace.end_upstream({200: 200, 502: 0}.get(status))
            self._finish(call, status, usage, replica.url)

    def _finish(self, call: Call, status: int, usage: dict[str, Any] | None, replica: str) -> None:
        if call.finished:
            return
        call.finished = True
        if call.trace is not None:
            call.trace.end(status, usage)
        prompt = int((usage or {}).get("prompt_tokens") or 0)
        completion = int((usage or {}).get("completion_tokens") or 0)
        if usage:
            used: int | None = prompt + completion
        elif status in (200, 499, 502):
            used = None  # tokens may have been spent without a usage report: the estimate stands
        else:
            used = 0  # refused or never served: the tenant gets its tokens back
        call.grant.settle(used)
        elapsed = time.monotonic() - call.started
        tenant, model = call.tenant.name, call.model
        m = self.metrics
        m.in_flight.labels(tenant).dec()
        m.requests.labels(tenant, model, str(status)).inc()
        m.duration.labels(tenant, model).observe(elapsed)
        if call.ttft_s is not None:
            m.ttft.labels(tenant, model).observe(call.ttft_s)
        if usage:
            m.tokens.labels(tenant, model, "prompt").inc(prompt)
            m.tokens.labels(tenant, model, "completion").inc(completion)
        record = MeterRecord(
            time=time.time(),
            request_id=call.request_id,
            client_request_id=call.client_request_id,
            tenant=tenant,
            model=model,
            priority=call.priority,
            status=status,
            prompt_tokens=prompt,
            completion_tokens=completion,
            latency_ms=round(elapsed * 1000, 1),
            ttft_ms=None if call.ttft_s is None else round(call.ttft_s * 1000, 1),
            stream=call.stream,
            replica=replica,
        )
        try:
            self.sink.write(record)
        except OSError:
            log.exception(
                "metering write failed", extra={"event": "metering_failed", "request_id": call.request_id}
            )


def _failed(replica: Replica, what: str, exc: UpstreamError) -> None:
    """Log that ``replica`` failed (``what``: how) and take it out until a probe finds it ready."""
    log.warning(what, extra={"event": "upstream_error", "replica": replica.url, "error": repr(exc)})
    replica.mark_down()


def _event_stream(upstream: Answer, call: Call) -> bool:
    """Whether a streamed request's answer streams: a replica may answer a non-streamed request the
    gateway sent as a stream (to migrate it) with one JSON body, which then goes through as is."""
    if call.stream:
        return True
    kind = next((value for name, value in upstream.headers if name == "content-type"), "")
    return kind.startswith("text/event-stream")


def _step(call: Call, name: str) -> AbstractContextManager[Span | None]:
    """A span around one step of a traced request; nothing for one that is not."""
    return call.trace.step(name) if call.trace is not None else nullcontext()


def _no_replica(call: Call, pool: Pool, tried: list[str]) -> GatewayError:
    """The 503 for a pool with no replica to take the request, with when to come back."""
    wait = max(1, math.ceil(pool.retry_after_s()))
    broken = sum(r.ready and not r.breaker.available() for r in pool.replicas)
    if broken and not tried:
        why = (
            f"Every ready replica of model {call.model!r} ({broken}) is out of rotation after "
            f"failing requests; one is tried again in {wait} s."
        )
    else:
        why = (
            f"No ready replica of model {call.model!r} could take the request"
            + (f" (tried {len(tried)})" if tried else "")
            + "; retry shortly."
        )
    return GatewayError(
        503,
        why,
        code="no_replica",
        headers={"Retry-After": str(wait)},
    )


async def _until_first_data(events: AsyncIterator[list[bytes]]) -> list[bytes] | None:
    """Events up to and including the batch of the first ``data:`` one; None when the stream
    broke before it."""
    held: list[bytes] = []
    try:
        async for batch in events:
            held += batch
            if any(event.startswith(b"data:") for event in batch):
                return held
    except UpstreamError:
        return None
    return None


def _event_json(event: bytes) -> dict[str, Any] | None:
    if not event.startswith(b"data:"):
        return None
    payload = event[5:].strip()
    if not payload.startswith(b"{"):
        return None
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _usage_in(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """The usage an event's parsed JSON (``_event_json``) reports, if any."""
    usage = data.get("usage") if data else None
    return usage if isinstance(usage, dict) else None


def _keep(data: dict[str, Any] | None, client_wants_usage: bool) -> bool:
    """Drop the usage-only chunk the gateway asked for on the client's behalf (``data``: the
    event's parsed JSON)."""
    if client_wants_usage:
        return True
    return not (data is not None and data.get("usage") and not data.get("choices"))


def _usage_of(body: bytes | memoryview) -> dict[str, Any] | None:
    try:
        data = json.loads(bytes(body))
    except ValueError:
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    return usage if isinstance(usage, dict) else None
