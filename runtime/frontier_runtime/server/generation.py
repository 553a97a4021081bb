"""One admitted generation request, run as its own ASGI response.

The response object owns the whole life of the request after validation: waiting for an engine
slot, streaming or collecting the engine's outputs, and — whatever happens — aborting the
sequence in the engine and giving the slot back. It races that work against the client's
``http.disconnect``: a client that leaves while queued, streaming or waiting for a non-streamed
answer cancels the work at once, which aborts its sequence and frees its KV blocks.

Streaming holds its response headers back while the request is queued, for up to the SSE
keep-alive interval, so that a queue timeout is still a plain 503. A request queued longer than
that gets its 200 headers and ``: keep-alive`` comments until admitted (proxies with idle
timeouts would otherwise cut it); if it then times out, the stream carries an error event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Any

from starlette.types import Receive, Scope, Send

from frontier_runtime.engine.api import EngineClient, EngineDeadError, KvTransferError
from frontier_runtime.requests import RequestOutput, SamplingParams
from frontier_runtime.server.admission import QueueTimeout, Ticket
from frontier_runtime.server.errors import APIError
from frontier_runtime.server.formats import DONE, KEEPALIVE, CompletionFormat, sse, usage
from frontier_runtime.server.state import ServerState
from frontier_runtime.server.tracing import RequestTrace
from frontier_runtime.structured.validate import output_problem

log = logging.getLogger("frontier_runtime.server")

# The failure reason counted when a finished constrained output fails its check.
STRUCTURED_OUTPUT_INVALID = "structured_output_invalid"
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class Generation:
    def __init__(
        self,
        state: ServerState,
        request_id: str,
        ticket: Ticket,
        prompt_ids: list[int],
        params: SamplingParams,
        fmt: CompletionFormat,
        *,
        stream: bool,
        include_usage: bool,
        token_ids: bool = False,
        echo_text: str = "",
        arrived_at: float,
        log_fields: dict[str, Any],
        trace: RequestTrace | None = None,
    ) -> None:
        self.state = state
        self.request_id = request_id
        # The client's X-Request-Id need not be unique; the engine's id must be.
        self.engine_id = uuid.uuid4().hex
        self.ticket = ticket
        self.prompt_ids = prompt_ids
        self.params = params
        self.fmt = fmt
        self.stream = stream
        self.include_usage = include_usage
        # Each streamed chunk carries its token ids (choices[0].token_ids): the gateway asked
        # (names.TOKEN_IDS_HEADER), to continue the stream elsewhere if this replica fails.
        self.token_ids = token_ids
        self.echo_text = echo_text
        self.arrived_at = arrived_at
        self.log = log_fields
        # None when tracing is off; else noted as the request goes and turned into spans at the end.
        self.trace = trace
        if trace is not None:
            trace.queued(ticket.enqueued_at, ticket.admitted_at)
        self._submitted = False
        self._finished = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        worker = asyncio.ensure_future(self._run(send))
        watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
        try:
            await asyncio.wait({worker, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not worker.done():
                worker.cancel()
                if watcher.done():
                    self.log["client_disconnected"] = True
                    self.state.metrics.failures.labels("client_disconnect").inc()
            watcher.cancel()
            with suppress(asyncio.CancelledError):
                await worker
            if self.trace is not None:
                left = "client_disconnected" if self.log.get("client_disconnected") else None
                self.trace.end(self.log.get("error") or left)
        if not worker.cancelled() and worker.exception() is not None:
            raise worker.exception()  # type: ignore[misc]

    async def _run(self, send: Send) -> None:
        try:
            if self.stream:
                await self._run_streaming(send)
            else:
                await self._run_unary(send)
        finally:
            if self._submitted and not self._finished:
                self._abort()
            self.ticket.release()

    # -- non-streaming ---------------------------------------------------------------------
    async def _run_unary(self, send: Send) -> None:
        try:
            await self.ticket.wait()
        except QueueTimeout as exc:
            await self._send_error(send, self._queue_timeout_error(exc))
            return
        self._admitted()
        text, logprobs, reason, last = [], [], "abort", None
        try:
            async for out in self._outputs():
                text.append(out.new_text)
                if out.logprobs:
                    logprobs.extend(out.logprobs)
                last = out
                if out.finished:
                    reason = out.finish_reason or "stop"
        except APIError as exc:
            await self._send_error(send, exc)
            return
        use = self._usage(last)
        self._check_structured_output("".join(text), reason)
        body = self.fmt.response(
            self.echo_text + "".join(text),
            logprobs if self.params.logprobs is not None else None,
            reason,
            use,
        )
        if last is not None and last.kv_transfer_params is not None:  # a prefill replica's answer
            body["kv_transfer_params"] = last.kv_transfer_params.to_json()
        payload = json.dumps(body, ensure_ascii=False).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    # -- streaming -------------------------------------------------------------------------
    async def _run_streaming(self, send: Send) -> None:
        keepalive = self.state.config.keepalive_s
        try:
            admitted = await self.ticket.wait(at_most=keepalive)
        except QueueTimeout as exc:
            await self._send_error(send, self._queue_timeout_error(exc))
            return
        await self._start_stream(send)
        while not admitted:
            await self._body(send, KEEPALIVE)
            try:
                admitted = await self.ticket.wait(at_most=keepalive)
            except QueueTimeout as exc:
                await self._body(send, sse(self._queue_timeout_error(exc).body()) + DONE, more=False)
                return
        self._admitted()
        opening = self.fmt.opening_chunk()
        if opening is not None and self.params.continuation is None:  # a continued stream's client has it
            await self._body(send, sse(opening))
        last = None
        text: list[str] = []
        try:
            async for out in self._outputs():
                last = out
                reason = (out.finish_reason or "stop") if out.finished else None
                if self.params.structured is not None:
                    text.append(out.new_text)
                    if reason is not None:
                        self._check_structured_output("".join(text), reason)
                if out.new_text or out.new_token_ids or reason:
                    logprobs = out.logprobs if self.params.logprobs is not None else None
                    chunk = self.fmt.chunk(out.new_text, logprobs, reason)
                    if self.token_ids:
                        chunk["choices"][0]["token_ids"] = out.new_token_ids
                    await self._body(send, sse(chunk))
        except APIError as exc:
            await self._body(send, sse(exc.body()) + DONE, more=False)
            return
        tail = sse(self.fmt.usage_chunk(self._usage(last))) if self.include_usage else b""
        await self._body(send, tail + DONE, more=False)

    async def _start_stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})

    async def _body(self, send: Send, data: bytes, more: bool = True) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": more})

    # -- shared ----------------------------------------------------------------------------
    def _admitted(self) -> None:
        queue_s = self.ticket.queue_seconds
        self.log["queue_ms"] = round(queue_s * 1000, 1)
        if self.trace is not None:
            self.trace.queued(self.ticket.enqueued_at, self.ticket.admitted_at)
        self.state.metrics.queue_time.labels(self.state.metrics.model_name).observe(queue_s)

    @property
    def engine(self) -> EngineClient:
        engine = self.state.engine
        assert engine is not None  # the app admits no request before the engine is attached
        return engine

    async def _outputs(self) -> AsyncIterator[RequestOutput]:
        metrics = self.state.metrics
        model = metrics.model_name
        first_at: float | None = None
        last_at = 0.0
        generated = 0
        try:
            self._submitted = True
            iterator = self.engine.submit(self.engine_id, self.prompt_ids, self.params)
            async for out in iterator:
                now = time.monotonic()
                if self.trace is not None:
                    self.trace.saw(out)
                if out.new_token_ids:
                    metrics.generation_tokens.labels(model).inc(len(out.new_token_ids))
                    if first_at is None:
                        metrics.prompt_tokens.labels(model).inc(out.prompt_tokens)
                        first_at = now
                        metrics.ttft.labels(model).observe(now - self.arrived_at)
                        self.log["ttft_ms"] = round((now - self.arrived_at) * 1000, 1)
                    else:
                        gap = (now - last_at) / len(out.new_token_ids)
                        for _ in out.new_token_ids:
                            metrics.itl.labels(model).observe(gap)
                    last_at = now
                    generated = out.completion_tokens
                if out.finished:
                    self._finished = True
                    self._record_finish(out, first_at)
                yield out
                if out.finished:
                    return
        except ValueError as exc:  # the engine refused the request's parameters
            self._finished = True
            raise APIError(400, str(exc), reason="invalid") from None
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except KvTransferError as exc:  # a decode replica's pull failed and its policy is 'fail'
            self._finished = True
            self.state.metrics.failures.labels("engine_error").inc()
            raise APIError(502, str(exc), code="kv_transfer_failed") from None
        except EngineDeadError as exc:
            self._finished = True
            self.state.metrics.failures.labels("engine_error").inc()
            raise APIError(503, f"The engine is not running: {exc}", code="engine_unavailable") from None
        except Exception as exc:
            self._finished = True
            log.exception("engine failed a request", extra={"request_id": self.request_id})
            self.state.metrics.failures.labels("engine_error").inc()
            raise APIError(
                500, f"the engine failed this request: {type(exc).__name__}", code="engine_error"
            ) from None
        finally:
            if generated:
                self.log["completion_tokens"] = generated

    def _check_structured_output(self, text: str, finish_reason: str) -> None:
        """A constrained output that finished with "stop" must satisfy its constraint; one that does
        not is logged with its raw text (for troubleshooting) and counted, and returned as is. Cut
        short by "length", the partial output is returned as is without a check."""
        output = self.params.structured
        if output is None or finish_reason != "stop":
            return
        self.state.metrics.structured_outputs.inc()
        problem = output_problem(output, text)
        if problem is None:
            return
        self.state.metrics.failures.labels(STRUCTURED_OUTPUT_INVALID).inc()
        self.log["structured_output_invalid"] = problem
        log.warning(
            "structured output does not satisfy its constraint",
            extra={
                "request_id": self.request_id,
                "kind": output.kind,
                "problem": problem,
                "raw_output": text,
            },
        )

    def _record_finish(self, out: RequestOutput, first_at: float | None) -> None:
        metrics = self.state.metrics
        e2e = time.monotonic() - self.arrived_at
        metrics.finished(
            finish_reason=out.finish_reason or "stop",
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            e2e_s=e2e,
            ttft_s=None if first_at is None else first_at - self.arrived_at,
        )
        self.log.update(
            finish_reason=out.finish_reason,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            cached_tokens=out.cached_prompt_tokens,
        )

    def _usage(self, last: RequestOutput | None) -> dict[str, Any]:
        if last is None:
            return usage(len(self.prompt_ids), 0, 0)
        return usage(last.prompt_tokens, last.completion_tokens, last.cached_prompt_tokens)

    def _abort(self) -> None:
        try:
            self.engine.abort(self.engine_id)
        except Exception:
            log.exception("abort failed", extra={"request_id": self.request_id})
        self.log["aborted"] = True

    def _queue_timeout_error(self, exc: QueueTimeout) -> APIError:
        timeout_ms = self.state.config.queue.timeout_ms
        return APIError(
            503,
            f"The server is overloaded: the request waited {self.ticket.queue_seconds * 1000:.0f} ms for a slot "
            f"(queue timeout {timeout_ms} ms) and was not started. Retry later.",
            code="queue_timeout",
            reason="queue_timeout",
            headers={"Retry-After": str(self.state.admission.retry_after_s())},
        )

    async def _send_error(self, send: Send, exc: APIError) -> None:
        if exc.reason:
            self.state.metrics.failures.labels(exc.reason).inc()
        self.log["error"] = exc.code or exc.reason
        payload = json.dumps(exc.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
        await send({"type": "http.response.start", "status": exc.status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
