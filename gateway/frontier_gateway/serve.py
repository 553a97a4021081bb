"""Run the gateway under uvicorn: build it from its config, probe replicas, flush metering, drain.

One server listens on two sockets: the public one (``host:port``, what the balancer forwards to)
and the admin one (``admin_host:admin_port``, loopback by default). A connection's local port
decides which app answers it, so the admin paths exist nowhere on the public socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpx
import uvicorn

from frontier_gateway.app import Gateway, create_admin_app, create_app
from frontier_gateway.config import Discovery, GatewayConfig, PoolConfig
from frontier_gateway.discovery import find_once, finder_for, follow
from frontier_gateway.keys import KeyReloader
from frontier_gateway.metering import flush_forever, open_sink
from frontier_gateway.metrics import Metrics
from frontier_gateway.pools import Pool, Pools
from frontier_gateway.quotas import open_quotas
from frontier_gateway.tenants import read_keys, replica_id_key
from frontier_gateway.tracing import GatewayTracing

log = logging.getLogger("frontier_gateway")


def build_gateway(config: GatewayConfig, *, secrets_client: Any | None = None) -> Gateway:
    """Everything but the HTTP client (made on the server's event loop at start)."""
    tenants, auth = read_keys(config, secrets_client)
    pools = Pools(config.models, config.affinity.max_imbalance, config.breaker, replica_id_key(auth))
    return Gateway(
        config=config,
        tenants=tenants,
        # An in-flight entry in a shared store outlives the longest request it may stand for.
        quotas=open_quotas(config.quota, tenants.all, hold_s=config.request_timeout_s + 60),
        pools=pools,
        metrics=Metrics(pools),
        sink=open_sink(config.metering.uri),
        upstream_auth=auth,
        tracing=GatewayTracing.start(config.tracing),
    )


def discovered(configs: Iterable[PoolConfig], pools: Pools) -> list[tuple[Pool, Discovery]]:
    """Every set of replicas the gateway finds rather than is given: a pool's own, and each role of
    a disaggregated pool whose halves are found on EC2 (each half on its node group)."""
    found: list[tuple[Pool, Discovery]] = []
    for pool_config in configs:
        pool = pools.by_model[pool_config.name]
        if pool_config.discovery is not None:
            found.append((pool, pool_config.discovery))
        if pool_config.disaggregation is not None and pool.disaggregated is not None:
            halves = {"prefill": pool.disaggregated.prefill, "decode": pool.disaggregated.decode}
            for role, spec in pool_config.disaggregation.discoveries().items():
                found.append((halves[role], spec))
    return found


def lifespan_for(gateway: Gateway):  # type: ignore[no-untyped-def]
    config = gateway.config

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
        timeout = httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s)
        # The probes and discovery use an httpx client; forwarded requests their own pool.
        async with (
            httpx.AsyncClient(limits=limits, timeout=timeout) as client,
            gateway.upstream_client() as upstream,
        ):
            gateway.start(upstream)
            found = [(pool, finder_for(spec)) for pool, spec in discovered(config.models, gateway.pools)]
            for pool, finder in found:
                await find_once(pool, finder)
            # One probe round before taking traffic, so readiness is true from the start when it can be.
            await gateway.pools.probe_once(client, config.readiness_path, config.probe)
            kv_pools = [p.kv for p in gateway.pools.by_model.values() if p.kv is not None]
            for kv in kv_pools:  # subscribe to the KV events of every replica known so far
                kv.subscriber.start()
            tasks = [asyncio.create_task(follow(pool, finder)) for pool, finder in found]
            reloader = KeyReloader(gateway, gateway.metrics.registry)
            if reloader.uses_secrets:
                wake = asyncio.Event()
                if threading.current_thread() is threading.main_thread():
                    # SIGHUP's default action ends the process; here it means "read the keys again now".
                    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, wake.set)
                tasks.append(asyncio.create_task(reloader.run_forever(wake)))
            tasks += [
                asyncio.create_task(gateway.pools.probe_forever(client, config.readiness_path, config.probe)),
                asyncio.create_task(flush_forever(gateway.sink, config.metering.flush_s)),
            ]
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for kv in kv_pools:
                    kv.subscriber.close()
                await gateway.quotas.aclose()
                await asyncio.to_thread(gateway.sink.flush)
                if gateway.tracing is not None:
                    await asyncio.to_thread(gateway.tracing.shutdown)  # the last spans leave

    return lifespan


class ByPort:
    """One ASGI app over both sockets: connections to ``admin_port`` reach the admin app, every
    other one (and the lifespan) the public app."""

    def __init__(self, public: Any, admin: Any, admin_port: int) -> None:
        self.public, self.admin, self.admin_port = public, admin, admin_port

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        local = scope.get("server") or ("", None)
        app = self.admin if scope["type"] != "lifespan" and local[1] == self.admin_port else self.public
        await app(scope, receive, send)


def listen(host: str, port: int) -> socket.socket:
    """A bound TCP socket whose accepted connections send each write at once.

    Without TCP_NODELAY a response's second small write (the body after the headers, each event of
    a stream) waits for the client's delayed ACK: tens of milliseconds. Accepted sockets inherit
    the option from the listener, and naming the protocol lets the event loop see a TCP socket and
    set it too (asyncio skips a socket made with protocol 0; uvloop sets it either way).
    """
    sock = socket.socket(
        socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def uvicorn_server(
    gateway: Gateway, *, admin_port: int, tls_cert: str | None = None, tls_key: str | None = None
) -> uvicorn.Server:
    """The server for both sockets; ``admin_port`` is the admin socket's bound port.

    With ``tls_cert`` and ``tls_key`` (PEM files) both sockets speak TLS: the load balancer's
    HTTPS ends in the gateway itself (an EC2 gateway host makes its certificate at boot,
    templates/gateway-cloud-init.yaml.j2), and the loopback admin socket shares the certificate.
    """
    app = ByPort(create_app(gateway, lifespan=lifespan_for(gateway)), create_admin_app(gateway), admin_port)
    config = uvicorn.Config(
        app,
        ssl_certfile=tls_cert,
        ssl_keyfile=tls_key,
        lifespan="on",
        log_level="warning",
        access_log=False,
        # In-flight answers finish on SIGTERM (uvicorn waits for them), within this bound.
        timeout_graceful_shutdown=30,
        timeout_keep_alive=75,  # above the ALB's idle timeout's usual 60 s
    )
    return uvicorn.Server(config)


def serve(
    config: GatewayConfig,
    host: str | None = None,
    port: int | None = None,
    admin_port: int | None = None,
    *,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> int:
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("TLS needs both --tls-cert and --tls-key (PEM files), or neither")
    gateway = build_gateway(config)
    public = listen(host or config.host, config.port if port is None else port)
    admin = listen(config.admin_host, config.admin_port if admin_port is None else admin_port)
    bound = public.getsockname()[1], admin.getsockname()[1]
    if bound[0] == bound[1]:
        raise ValueError(f"the public and admin sockets share port {bound[0]}: give them different ports")
    server = uvicorn_server(gateway, admin_port=bound[1], tls_cert=tls_cert, tls_key=tls_key)
    for what, sock in (("listening", public), ("admin (metrics)", admin)):
        print(f"frontier_gateway: {what} on {sock.getsockname()[0]}:{sock.getsockname()[1]}", flush=True)
    server.run(sockets=[public, admin])
    return 0
