"""The gateway on the local stack: tenant keys in moto's Secrets Manager, ``gateway.yaml`` for the
host slots' runtimes, and the gateway process itself (``python -m frontier_gateway``).

Each tenant's key is generated once, stored in moto as its SHA-256 digest only, and kept in clear
only in ``<state_dir>/tenants/<name>.key`` (mode 0600) for local clients.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from frontier.access.gateway import new_tenant_key, render_gateway_config, static_replicas
from frontier.config.schema import Local, Settings
from frontier.targets.local import cluster, services

SERVICE = "gateway"


def tenant_key_file(settings: Settings, tenant: str) -> Path:
    return cluster.state_dir(settings) / "tenants" / f"{tenant}.key"


def tenant_key(settings: Settings, tenant: str) -> str:
    path = tenant_key_file(settings, tenant)
    if not path.exists():
        raise cluster.LocalStackError(f"{path}: no key for tenant {tenant!r} yet — start the gateway first")
    return path.read_text().strip()


def gateway_url(settings: Settings) -> str:
    assert settings.gateway is not None
    local = settings.section(Local)
    return f"http://{local.bind_address}:{settings.gateway.port}"


def ensure_tenant_keys(settings: Settings) -> list[cluster.Component]:
    """A key per tenant: digest in moto, the key itself in a 0600 file; existing ones are kept."""
    from botocore.exceptions import ClientError

    # Tenants' secrets are the stack's resources (Pulumi's on a cloud stack): the admin makes them.
    sm = cluster.aws_client(settings, "secretsmanager", actor="admin")
    report = []
    for tenant in settings.tenants:
        path = tenant_key_file(settings, tenant.name)
        try:
            sm.get_secret_value(SecretId=tenant.api_key_secret)
            exists = path.exists()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
            exists = False
        if exists:
            report.append(cluster.Component(f"tenant {tenant.name}", "exists", str(path)))
            continue
        key, secret = new_tenant_key()
        try:
            sm.put_secret_value(SecretId=tenant.api_key_secret, SecretString=secret)
        except ClientError:
            sm.create_secret(Name=tenant.api_key_secret, SecretString=secret)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(key + "\n")
        report.append(
            cluster.Component(
                f"tenant {tenant.name}", "created", f"{tenant.api_key_secret} (key: {path}, 0600)"
            )
        )
    return report


def start(settings: Settings, timeout: float = 30.0) -> list[cluster.Component]:
    """Start the gateway in front of the slots' runtimes (a running one is stopped first: its
    config may be another stack file's)."""
    assert settings.gateway is not None
    local = settings.section(Local)
    # The gateway's user reads the tenants' secrets of this stack file, and every pool's key secret.
    report = [cluster.identities(settings), *cluster.api_key_secrets(settings), *ensure_tenant_keys(settings)]
    state = cluster.state_dir(settings)
    running = services.find(state, SERVICE)
    if running is not None:
        services.stop(running)
    config = state / "gateway" / "gateway.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    metering = str(cluster.resolve(settings.gateway.metering.uri))
    config.write_text(render_gateway_config(settings, static_replicas(settings), metering_uri=metering))
    address, port = local.bind_address, settings.gateway.port
    services.require_free_port(address, port, SERVICE)
    command = [sys.executable, "-m", "frontier_gateway", "serve", "--config", str(config), "--host", address]
    log = state / "gateway" / "gateway.log"
    env = {**os.environ, **cluster.aws_env(settings, "gateway"), **cluster.traces_env(settings)}
    service = services.spawn(SERVICE, command, state, log, address, port, env=env)
    services.wait_for_port(address, port, timeout, service)
    report.append(
        cluster.Component(
            "gateway",
            "started",
            f"{gateway_url(settings)} (pid {service.pid}); {len(settings.pools)} models, {len(settings.tenants)} tenants",
        )
    )
    return report


def stop(settings: Settings) -> cluster.Component:
    service = services.find(cluster.state_dir(settings), SERVICE)
    if service is None:
        return cluster.Component("gateway", "absent", "not running")
    services.stop(service)
    return cluster.Component("gateway", "stopped", f"pid {service.pid}")


def describe(settings: Settings) -> str:
    return json.dumps({"url": gateway_url(settings), "tenants": [t.name for t in settings.tenants]})
