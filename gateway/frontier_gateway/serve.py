"""Run the gateway under uvicorn: build it from its config, probe replicas, flush metering, drain."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn

from frontier_gateway.app import Gateway, create_app
from frontier_gateway.config import Ec2Discovery, GatewayConfig
from frontier_gateway.discovery import discover, follow
from frontier_gateway.metering import flush_forever, open_sink
from frontier_gateway.metrics import Metrics
from frontier_gateway.pools import Pools
from frontier_gateway.quotas import Quotas
from frontier_gateway.tenants import load_tenants, upstream_key

log = logging.getLogger("frontier_gateway")


def build_gateway(config: GatewayConfig, *, secrets_client: Any | None = None) -> Gateway:
    """Everything but the HTTP client (made on the server's event loop at start)."""
    tenants = load_tenants(config.tenants, client=secrets_client)
    pools = Pools(config.models, config.affinity.max_imbalance)
    auth = (
        upstream_key(secrets_client, config.upstream_api_key_secret)
        if config.upstream_api_key_secret
        else None
    )
    return Gateway(
        config=config,
        tenants=tenants,
        quotas=Quotas(tenants.all),
        pools=pools,
        metrics=Metrics(pools),
        sink=open_sink(config.metering.uri),
        upstream_auth=auth,
    )


def ec2_client(spec: Ec2Discovery) -> Any:
    import boto3

    return boto3.client("ec2", region_name=spec.region)


def lifespan_for(gateway: Gateway):  # type: ignore[no-untyped-def]
    config = gateway.config

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
        timeout = httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            gateway.start(client)
            for pool_config in config.models:
                if pool_config.discovery is not None:
                    pool = gateway.pools.by_model[pool_config.name]
                    pool.set_urls(
                        await asyncio.to_thread(
                            discover, ec2_client(pool_config.discovery), pool_config.discovery
                        )
                    )
            # One probe round before taking traffic, so readiness is true from the start when it can be.
            await gateway.pools.probe_once(client, config.readiness_path, config.probe)
            tasks = [
                asyncio.create_task(
                    follow(gateway.pools.by_model[p.name], p.discovery, ec2_client(p.discovery))
                )
                for p in config.models
                if p.discovery is not None
            ]
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
                await asyncio.to_thread(gateway.sink.flush)

    return lifespan


def uvicorn_server(gateway: Gateway, host: str, port: int) -> uvicorn.Server:
    app = create_app(gateway, lifespan=lifespan_for(gateway))
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        log_level="warning",
        access_log=False,
        # In-flight answers finish on SIGTERM (uvicorn waits for them), within this bound.
        timeout_graceful_shutdown=30,
        timeout_keep_alive=75,  # above the ALB's idle timeout's usual 60 s
    )
    return uvicorn.Server(config)


def serve(config: GatewayConfig, host: str | None = None, port: int | None = None) -> int:
    gateway = build_gateway(config)
    server = uvicorn_server(gateway, host or config.host, config.port if port is None else port)
    sock = socket.socket(socket.AF_INET6 if ":" in (host or config.host) else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host or config.host, config.port if port is None else port))
    print(f"frontier_gateway: listening on {sock.getsockname()[0]}:{sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])
    return 0
