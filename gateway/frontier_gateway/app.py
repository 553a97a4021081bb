"""The gateway's HTTP app: OpenAI-compatible routes in front of the model pools.

Each inference request passes the same gates, cheapest first: API key (401) → body size (413) →
JSON (400) → model known and allowed to the tenant (404, the same answer for both so a key learns
nothing about models it may not use) → priority (400) → tenant quotas (429 with OpenAI's
``x-ratelimit-*`` headers) → a ready replica (503) → the runtime.

Two apps share one gateway: the public one (the API, and bare liveness and readiness for the
balancer) and the admin one, served on its own address and port (``admin_host:admin_port``,
loopback by default), with ``/metrics`` and the per-model readiness detail. Nothing a tenant can
reach names another tenant, a model it may not use, or a replica's address.

Every request gets the gateway's own id (a uuid): it keys the metering record, travels upstream
and comes back in ``x-request-id``. A client's own id is only echoed and metered beside it.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from frontier_hostside import names
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from frontier_gateway.config import GatewayConfig
from frontier_gateway.errors import GatewayError, invalid
from frontier_gateway.metering import Sink
from frontier_gateway.metrics import CONTENT_TYPE, Metrics
from frontier_gateway.migration import interrupt_route
from frontier_gateway.pools import Pools
from frontier_gateway.proxy import Call, Proxy
from frontier_gateway.quotas import Quotas, QuotaStoreError, Refusal, estimate_tokens
from frontier_gateway.tenants import Tenant, Tenants, UpstreamKeys
from frontier_gateway.tracing import CallTrace, GatewayTracing
from frontier_gateway.upstream import Upstream

# A client's id is kept only when it is this short and plain (it lands in logs and metering).
CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/=+-]{1,128}$")


@dataclass
class Gateway:
    """Everything a request needs, built once at start."""

    config: GatewayConfig
    tenants: Tenants
    quotas: Quotas
    pools: Pools
    metrics: Metrics
    sink: Sink
    upstream_auth: UpstreamKeys = field(default_factory=dict)  # each pool's runtimes' key, by model
    proxy: Proxy | None = None  # set at start-up, once the HTTP client exists
    tracing: GatewayTracing | None = None  # None: no collector named, no spans made

    def __post_init__(self) -> None:
        self.pools.set_holds(self.config.hold)

    def start(self, upstream: Upstream) -> None:
        self.proxy = Proxy(
            upstream,
            self.metrics,
            self.sink,
            self.config.retries,
            self.upstream_auth,
            self.config.migration_limit,
        )

    def upstream_client(self) -> Upstream:
        """The client forwarded requests take to the replicas (made on the server's event loop)."""
        return Upstream(
            connect_timeout_s=self.config.connect_timeout_s, read_timeout_s=self.config.request_timeout_s
        )


def create_app(gateway: Gateway, lifespan: Any = None) -> Starlette:
    """The public app: what the balancer forwards to."""
    routes = [
        Route(names.COMPLETIONS_PATH, _completions, methods=["POST"]),
        Route(names.CHAT_COMPLETIONS_PATH, _chat_completions, methods=["POST"]),
        Route(names.MODELS_PATH, _models, methods=["GET"]),
        Route(names.READINESS_PATH, _ready, methods=["GET", "HEAD"]),
        Route(names.LIVENESS_PATH, _live, methods=["GET", "HEAD"]),
    ]
    app = Starlette(routes=routes, exception_handlers={GatewayError: _error}, lifespan=lifespan)
    app.state.gateway = gateway
    return app


def create_admin_app(gateway: Gateway) -> Starlette:
    """The admin app: for the host's scraper and operators, on the admin address only."""
    routes = [
        Route(names.METRICS_PATH, _metrics, methods=["GET"]),
        Route(names.GATEWAY_INTERRUPT_PATH, interrupt_route, methods=["POST"]),
        Route(names.READINESS_PATH, _ready_detail, methods=["GET", "HEAD"]),
        Route(names.LIVENESS_PATH, _live, methods=["GET", "HEAD"]),
    ]
    app = Starlette(routes=routes)
    app.state.gateway = gateway
    return app


async def _error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return exc.response()


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def _identify(gw: Gateway, request: Request) -> Tenant:
    tenant = gw.tenants.identify(request.headers.get("authorization"))
    if tenant is None:
        raise GatewayError(
            401,
            "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return tenant


async def _read_body(gw: Gateway, request: Request) -> dict[str, Any]:
    limit = gw.config.max_body_bytes
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise GatewayError(
                413,
                f"request body of more than {limit} bytes exceeds the limit of {limit} bytes",
                code="body_too_large",
            )
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as exc:
        raise invalid(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise invalid(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _affinity_key(gw: Gateway, request: Request, body: dict[str, Any]) -> str | None:
    affinity = gw.config.affinity
    if affinity.mode == "off":
        return None
    session = request.headers.get(affinity.header)
    if session:
        return "session:" + session
    if affinity.mode == "header":
        return None
    if isinstance(body.get("messages"), list):
        text = "".join(
            f"{m.get('role')}:{m.get('content')}\n" for m in body["messages"] if isinstance(m, dict)
        )
    else:
        text = json.dumps(body.get("prompt"))
    prefix = text[: affinity.prefix_chars]
    return "prefix:" + hashlib.blake2b(prefix.encode("utf-8", errors="replace"), digest_size=16).hexdigest()


async def _completions(request: Request) -> Response:
    return await _generate(request, names.COMPLETIONS_PATH)


async def _chat_completions(request: Request) -> Response:
    return await _generate(request, names.CHAT_COMPLETIONS_PATH)


def _client_request_id(request: Request) -> str | None:
    """The client's own id (``x-client-request-id``, or ``x-request-id`` as clients sent it
    before), when short and plain; anything else is dropped."""
    supplied = request.headers.get(names.CLIENT_REQUEST_ID_HEADER) or request.headers.get(
        names.REQUEST_ID_HEADER
    )
    return supplied if supplied and CLIENT_REQUEST_ID.match(supplied) else None


async def _generate(request: Request, path: str) -> Response:
    gw = _gateway(request)
    request_id = uuid.uuid4().hex
    trace = gw.tracing.begin(request_id, path) if gw.tracing is not None else None
    client_request_id = _client_request_id(request)
    with _step(trace, "gateway.auth"):
        tenant = _identify(gw, request)
    headers = {names.REQUEST_ID_HEADER: request_id}
    if client_request_id:
        headers[names.CLIENT_REQUEST_ID_HEADER] = client_request_id
    try:
        body = await _read_body(gw, request)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise invalid("model: a model name is required", "model")
        if model not in gw.pools.by_model or model not in tenant.models:
            allowed = ", ".join(sorted(tenant.models))
            raise GatewayError(
                404,
                f"The model {model!r} does not exist or you do not have access to it (this key may use: {allowed}).",
                code="model_not_found",
                param="model",
            )
        asked = body.get(names.PRIORITY_FIELD)
        if asked is not None and asked not in names.PRIORITY_CLASSES:
            raise invalid(
                f"{names.PRIORITY_FIELD}: must be one of {', '.join(names.PRIORITY_CLASSES)}, got {asked!r}",
                names.PRIORITY_FIELD,
            )
        # A tenant's class is the most it gets; any tenant may ask for batch on its own.
        priority = names.BATCH if names.BATCH in (tenant.priority, asked) else names.INTERACTIVE
        body[names.PRIORITY_FIELD] = priority
        pool = gw.pools.route(model, priority)
        stream = bool(body.get("stream"))
        asked_options = body.get("stream_options")
        options: dict[str, Any] = asked_options if isinstance(asked_options, dict) else {}
        wants_usage = bool(options.get("include_usage"))
        if stream:
            # The runtime's usage chunk is the meter; asked for on the client's behalf, then dropped.
            body["stream_options"] = {**options, "include_usage": True}
        if trace is not None:
            trace.attributes.update(
                {"frontier.tenant": tenant.name, "frontier.model": model, "frontier.priority": priority}
            )
        with _step(trace, "gateway.quota"):
            try:
                admitted = await gw.quotas.admit(
                    tenant, estimate_tokens(body, gw.config.default_max_tokens), request_id
                )
            except QuotaStoreError as exc:
                raise GatewayError(
                    503,
                    f"{exc}; the request was not admitted. Retry shortly.",
                    code="quota_store_unavailable",
                    headers={"Retry-After": "1"},
                ) from None
            headers.update(admitted.levels.headers())
            if isinstance(admitted, Refusal):
                gw.metrics.rate_limited.labels(tenant.name, admitted.limit).inc()
                gw.metrics.requests.labels(tenant.name, model, "429").inc()
                raise GatewayError(
                    429,
                    admitted.message,
                    code="rate_limit_exceeded",
                    type_=admitted.limit,
                    headers={"Retry-After": str(max(1, round(admitted.retry_after_s + 0.5)))},
                )
    except GatewayError as exc:
        if trace is not None:
            trace.end(exc.status)
        return exc.response(headers)
    call = Call(
        request_id=request_id,
        client_request_id=client_request_id,
        tenant=tenant,
        model=model,
        priority=priority,
        path=path,
        body=json.dumps(body).encode(),
        stream=stream,
        client_wants_usage=wants_usage,
        grant=admitted,
        affinity_key=_affinity_key(gw, request, body),
        headers=headers,
        until_disconnect=lambda: _until_disconnect(request),
        trace=trace,
        kv_keys=pool.kv.keys_for(body) if pool.kv is not None else None,
    )
    assert gw.proxy is not None  # set at start-up
    return await gw.proxy.forward(call, pool)


def _step(trace: CallTrace | None, name: str) -> AbstractContextManager[object]:
    """A span around one step of the request when it is traced; nothing otherwise."""
    return trace.step(name) if trace is not None else nullcontext()


async def _until_disconnect(request: Request) -> None:
    """Return when the client has gone (the body is read by now: what comes next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _models(request: Request) -> Response:
    gw = _gateway(request)
    tenant = _identify(gw, request)
    cards = [
        {"id": name, "object": "model", "created": 0, "owned_by": "frontier"}
        for name in gw.pools.by_model
        if name in tenant.models
    ]
    return JSONResponse({"object": "list", "data": cards})


async def _ready(request: Request) -> Response:
    # Only yes or no: the balancer needs no more, and anyone may ask.
    ready = _gateway(request).pools.ready()
    return JSONResponse({"ready": ready}, status_code=200 if ready else 503)


async def _ready_detail(request: Request) -> Response:
    pools = _gateway(request).pools
    ready = pools.ready()
    return JSONResponse({"ready": ready, "models": pools.summary()}, status_code=200 if ready else 503)


async def _live(request: Request) -> Response:
    return JSONResponse({"live": True})


async def _metrics(request: Request) -> Response:
    return Response(_gateway(request).metrics.render(), media_type=CONTENT_TYPE)
