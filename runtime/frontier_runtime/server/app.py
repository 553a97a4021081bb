"""The OpenAI-compatible HTTP app: routes, the order of checks, and per-request bookkeeping.

Every inference request passes the same gates, cheapest first, so a refusal costs little:
draining (503) → API key (401) → body size (413, before parsing) → JSON and fields (400) →
model (404) → admission (429 when the queue is full; nothing tokenised yet) → tokenise →
context length (400 naming both numbers) → wait for a slot (503 after the queue timeout) → engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from frontier_hostside import names
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from frontier_runtime.requests import SamplingParams
from frontier_runtime.server.admission import QueueFull, Ticket
from frontier_runtime.server.errors import APIError, invalid
from frontier_runtime.server.formats import ChatFormat, CompletionFormat
from frontier_runtime.server.generation import Generation
from frontier_runtime.server.logs import request_log
from frontier_runtime.server.metrics import CONTENT_TYPE
from frontier_runtime.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    parse_body,
    resolve_max_tokens,
)
from frontier_runtime.server.state import ServerState
from frontier_runtime.server.text import TemplateRenderError, TextCodec
from frontier_runtime.server.tracing import RequestTrace, RequestTracing
from frontier_runtime.structured.grammar import compile_grammar

log = logging.getLogger("frontier_runtime.server")

REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/=+-]{1,128}$")
INFERENCE_ROUTES = (names.COMPLETIONS_PATH, names.CHAT_COMPLETIONS_PATH)
# Tokenising a long prompt takes milliseconds; off the event loop so liveness stays quick.
TOKENIZE_INLINE_CHARS = 8192
# Likewise compiling a large JSON schema (milliseconds the first time; cached after).
COMPILE_INLINE_CHARS = 4096


def create_app(state: ServerState) -> ASGIApp:
    routes = [
        Route(names.COMPLETIONS_PATH, _completions, methods=["POST"]),
        Route(names.CHAT_COMPLETIONS_PATH, _chat_completions, methods=["POST"]),
        Route(names.MODELS_PATH, _models, methods=["GET"]),
        Route(state.config.health.liveness_path, _live, methods=["GET", "HEAD"]),
        Route(state.config.health.readiness_path, _ready, methods=["GET", "HEAD"]),
        Route(names.METRICS_PATH, _metrics, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={APIError: _api_error, HTTPException: _http_error},
    )
    app.state.server = state
    # None when the config names no collector: then requests make no spans at all.
    app.state.tracing = RequestTracing.start(state.config.tracing, state.config.model.name)
    return RequestContext(app, state)


# -- middleware ---------------------------------------------------------------------------


class RequestContext:
    """Outermost layer: request id, one JSON log line and the HTTP metrics for every request,
    the count of in-flight inference requests (drain waits on it), and a last-resort 500."""

    def __init__(self, app: Starlette, state: ServerState) -> None:
        self.app = app
        self.state = state
        self.routes = {r.path for r in app.routes if isinstance(r, Route)}
        health = state.config.health
        self.probes = {health.liveness_path, health.readiness_path, names.METRICS_PATH}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        supplied = _header(scope, b"x-request-id")
        request_id = supplied if supplied and REQUEST_ID.match(supplied) else uuid.uuid4().hex
        fields: dict[str, Any] = {}
        scope.setdefault("state", {})
        scope["state"].update(request_id=request_id, log=fields, arrived_at=started)
        status = 0
        path = scope["path"]
        route = path if path in self.routes else names.OTHER_ROUTE
        inference = path in INFERENCE_ROUTES
        if inference:
            self._enter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                if self.state.health.draining and inference:
                    headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error", extra={"request_id": request_id, "path": path})
            if status == 0:
                status = 500
                await APIError(500, "internal error", code="internal_error").response(request_id)(
                    scope, receive, send_with_id
                )
        finally:
            if inference:
                self._leave()
            elapsed = time.monotonic() - started
            # Probes and scrapes are not traffic: left out so that a gate's error rate and p99 over
            # these series describe what clients saw (a draining readiness 503 is not an error).
            if route not in self.probes:
                code = str(status or 499)  # 499: the client left before any answer was sent
                self.state.metrics.http_requests.labels(route, code).inc()
                self.state.metrics.http_duration.labels(route).observe(elapsed)
                request_log.info(
                    "request",
                    extra={
                        "event": "request",
                        "request_id": request_id,
                        "method": scope["method"],
                        "path": path,
                        "status": status or 499,
                        "duration_ms": round(elapsed * 1000, 1),
                        **fields,
                    },
                )

    def _enter(self) -> None:
        self.state.in_flight += 1
        if self.state.idle is not None:
            self.state.idle.clear()

    def _leave(self) -> None:
        self.state.in_flight -= 1
        if self.state.in_flight == 0 and self.state.idle is not None:
            self.state.idle.set()


def _header(scope: Scope, name: bytes) -> str | None:
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


# -- error handlers -----------------------------------------------------------------------


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    state: ServerState = request.app.state.server
    if exc.reason:
        state.metrics.failures.labels(exc.reason).inc()
    request.scope["state"]["log"]["error"] = exc.code or exc.reason
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        error = APIError(404, f"no route {request.url.path!r}", code="not_found")
    elif exc.status_code == 405:
        error = APIError(
            405, f"method {request.method} is not allowed on {request.url.path!r}", code="method_not_allowed"
        )
    else:
        error = APIError(exc.status_code, str(exc.detail))
    return await _api_error(request, error)


# -- gates --------------------------------------------------------------------------------


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    return state


def _refuse_unless_serving(state: ServerState) -> None:
    if state.health.draining:
        raise APIError(
            503,
            "The server is shutting down and takes no new requests; retry on another replica.",
            code="draining",
            reason="draining",
            headers={"Retry-After": "1"},
        )
    if state.engine is None or state.codec is None or not state.health.warmed_up:
        raise APIError(
            503,
            "The model is still loading.",
            code="not_ready",
            reason="not_ready",
            headers={"Retry-After": "5"},
        )


def _authorize(state: ServerState, request: Request) -> None:
    if state.api_keys is None:
        return
    if not state.api_keys.check(request.headers.get("authorization")):
        raise APIError(
            401,
            "Missing or invalid API key: send 'Authorization: Bearer <key>'.",
            code="invalid_api_key",
            reason="unauthorized",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def _read_json(state: ServerState, request: Request) -> Any:
    limit = state.config.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise invalid(f"Content-Length {declared!r} is not a number")
        if int(declared) > limit:
            raise _too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise invalid("the request body is empty; send a JSON object")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise invalid(f"the request body is not valid JSON: {exc}") from None


def _too_large(size: int, limit: int) -> APIError:
    return APIError(
        413,
        f"request body of {size} bytes exceeds the limit of {limit} bytes",
        code="body_too_large",
        reason="too_large",
    )


def _check_model(state: ServerState, model: str | None) -> str:
    """The name the answer carries: the one the request gave, if this server answers to it."""
    served = state.config.model
    if model is None:
        return served.name
    if model != served.name and model not in served.aliases:
        raise APIError(
            404,
            f"The model {model!r} does not exist on this server; it serves {served.name!r}.",
            param="model",
            code="model_not_found",
            reason="not_found",
        )
    return model


def _enter_queue(state: ServerState, priority: str) -> Ticket:
    try:
        return state.admission.try_enter(priority)
    except QueueFull as exc:
        raise APIError(
            429,
            f"Model is overloaded: {exc}. Retry later.",
            code="queue_full",
            reason="queue_full",
            headers={"Retry-After": str(state.admission.retry_after_s())},
        ) from None


async def _encode(codec: TextCodec, text: str, *, add_special_tokens: bool) -> list[int]:
    try:
        if len(text) <= TOKENIZE_INLINE_CHARS:
            return codec.encode(text, add_special_tokens=add_special_tokens)
        return await asyncio.to_thread(codec.encode, text, add_special_tokens=add_special_tokens)
    except (UnicodeError, ValueError, TypeError, OverflowError) as exc:  # e.g. lone surrogates
        raise invalid(f"the text cannot be tokenised: {exc}", "prompt") from None


def _check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise invalid(f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})", param)


# -- routes -------------------------------------------------------------------------------


async def _completions(request: Request) -> Generation:
    return await _generate(request, CompletionRequest, CompletionFormat, _completion_prompt)


async def _chat_completions(request: Request) -> Generation:
    return await _generate(request, ChatCompletionRequest, ChatFormat, _chat_prompt)


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    param: str  # the body field it came from, named in errors
    echo_text: str = ""  # text the response starts with (completions with echo)


async def _completion_prompt(body: CompletionRequest, codec: TextCodec) -> Prompt:
    prompt = body.single_prompt()
    if isinstance(prompt, str):
        ids = await _encode(codec, prompt, add_special_tokens=True)
        text = prompt
    else:
        _check_token_ids(prompt, codec.vocab_size, "prompt")
        ids = list(prompt)
        text = codec.decode(ids) if body.echo else ""
    if not ids:
        raise invalid("the prompt is empty", "prompt")
    return Prompt(ids, "prompt", text if body.echo else "")


async def _chat_prompt(body: ChatCompletionRequest, codec: TextCodec) -> Prompt:
    messages = [m.as_template_input() for m in body.messages]
    try:
        text = codec.render_chat(messages, add_generation_prompt=body.add_generation_prompt)
    except TemplateRenderError as exc:
        raise invalid(str(exc), "messages") from None
    # The template already placed BOS and other special tokens where the model expects them.
    ids = await _encode(codec, text, add_special_tokens=False)
    if not ids:
        raise invalid("the rendered conversation is empty", "messages")
    return Prompt(ids, "messages")


async def _check_structured_output(body: GenerationRequest) -> None:
    """Compile the request's output constraint (cached) before it takes a slot: 400 naming the problem."""
    output = body.structured_output()
    if output is None:
        return
    try:
        if len(output.spec) <= COMPILE_INLINE_CHARS:
            compile_grammar(output)
        else:
            await asyncio.to_thread(compile_grammar, output)
    except ValueError as exc:
        raise invalid(str(exc), body.structured_output_param(), "invalid_structured_output") from None


Body = TypeVar("Body", bound=GenerationRequest)


async def _generate(
    request: Request,
    body_type: type[Body],
    fmt_class: type[CompletionFormat],
    build_prompt: Callable[[Body, TextCodec], Awaitable[Prompt]],
) -> Generation:
    """Both generation routes: the gates in order, then the prompt, then a ``Generation``."""
    state = _state(request)
    _refuse_unless_serving(state)
    _authorize(state, request)
    body = parse_body(body_type, await _read_json(state, request))
    body.check_supported()
    await _check_structured_output(body)
    model = _check_model(state, body.model)
    ticket = _enter_queue(state, body.priority)
    try:
        codec = state.codec
        assert codec is not None  # _refuse_unless_serving
        prompt = await build_prompt(body, codec)
        _check_token_ids(list(body.stop_token_ids or ()), codec.vocab_size, "stop_token_ids")
        if body.frontier_continuation is not None:
            _check_token_ids(
                body.frontier_continuation.token_ids, codec.vocab_size, "frontier_continuation.token_ids"
            )
        max_tokens = resolve_max_tokens(
            body.requested_max_tokens(),
            len(prompt.token_ids),
            state.config.model.max_seq_len,
            tokens_param=body.max_tokens_param(),
            prompt_param=prompt.param,
        )
        try:
            params = body.sampling_params(max_tokens)
        except ValueError as exc:
            raise invalid(str(exc), "frontier_continuation" if "continuation" in str(exc) else None) from None
    except BaseException:
        ticket.release()
        raise
    request_id = request.scope["state"]["request_id"]
    fields = request.scope["state"]["log"]
    fields.update(
        model=model,
        stream=body.stream,
        prompt_tokens=len(prompt.token_ids),
        max_tokens=params.max_tokens,
        priority=params.priority,
    )
    if params.structured is not None:
        fields["structured_output"] = params.structured.kind
    for name in ("user", "safety_identifier"):
        if getattr(body, name):
            fields[name] = getattr(body, name)
    return Generation(
        state,
        request_id,
        ticket,
        prompt.token_ids,
        params,
        fmt_class(request_id, model, int(time.time()), codec.decode_token),
        stream=body.stream,
        include_usage=body.include_usage(),
        token_ids=request.headers.get(names.TOKEN_IDS_HEADER) == "1",
        echo_text=prompt.echo_text,
        arrived_at=request.scope["state"]["arrived_at"],
        log_fields=fields,
        trace=_trace(request, request_id, params),
    )


def _trace(request: Request, request_id: str, params: SamplingParams) -> RequestTrace | None:
    """The request's trace when tracing is on: it continues the caller's ``traceparent``."""
    tracing: RequestTracing | None = request.app.state.tracing
    if tracing is None:
        return None
    trace = tracing.begin(request.headers, request_id, request.scope["state"]["arrived_at"])
    trace.attributes.update({"frontier.priority": params.priority, "frontier.max_tokens": params.max_tokens})
    return trace


async def _models(request: Request) -> Response:
    state = _state(request)
    _authorize(state, request)
    name = state.config.model.name
    card = {
        "id": name,
        "object": "model",
        "created": state.created,
        "owned_by": "frontier",
        "root": name,
        "max_model_len": state.config.model.max_seq_len,
    }
    return JSONResponse({"object": "list", "data": [card]})


async def _live(request: Request) -> Response:
    ok, detail = _state(request).health.live()
    return JSONResponse(detail, status_code=200 if ok else 503)


async def _ready(request: Request) -> Response:
    ok, detail = _state(request).health.ready()
    return JSONResponse(detail, status_code=200 if ok else 503)


async def _metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)
