"""The gateway's ``gateway.yaml`` for a stack: its pools and replicas, its tenants, its settings.

Rendered from the typed stack settings and validated with the gateway's own config model (as the
runtime's file is validated with the runtime's), so a file the gateway would refuse never ships.
Tenants are written with their Secrets Manager secret (digests only), never with a key.
"""

from __future__ import annotations

import hashlib
import json
import secrets as token_source
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from frontier_gateway.config import GatewayConfig, parse_config

from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.project import root


def gateway_document(
    settings: Settings, replicas: Mapping[str, list[str]] | None, *, metering_uri: str | None = None
) -> dict:
    """``gateway.yaml`` as data; ``replicas``: base URLs of each model's runtimes, or None to find
    them on EC2 by their tags (each pool's node group)."""
    gw = settings.gateway
    if gw is None:
        raise FrontierError(f"stack {settings.stack!r} has no 'frontier:gateway' section")
    models: list[dict[str, Any]] = []
    for pool in settings.pools:
        if replicas is None:
            discovery = {
                "stack": settings.stack,
                "node_group": settings.pool_group(pool).name,
                "port": pool.runtime.port,
                "region": settings.region,
            }
            models.append({"name": pool.name, "discovery": discovery})
            continue
        urls = list(replicas.get(pool.name) or ())
        if not urls:
            raise FrontierError(f"model {pool.name!r} of stack {settings.stack!r} has no replica address")
        models.append({"name": pool.name, "replicas": urls})
    return {
        "host": "0.0.0.0",
        "port": gw.port,
        "models": models,
        "tenants": [
            {
                "name": t.name,
                "api_key_secret": t.api_key_secret,
                "models": list(t.models),
                "requests_per_minute": t.requests_per_minute,
                "tokens_per_minute": t.tokens_per_minute,
                "max_concurrent_requests": t.max_concurrent_requests,
                "priority": t.priority,
            }
            for t in settings.tenants
        ],
        # Every pool's runtimes share the stack's key secret: the gateway is their one client.
        "upstream_api_key_secret": settings.runtime.api_keys_secret,
        "affinity": {
            "mode": gw.session_affinity,
            "header": gw.session_header,
            "prefix_chars": gw.prefix_chars,
        },
        "probe": {"path": settings.health.readiness_path, "interval_s": gw.probe_interval_s},
        "metering": {"uri": metering_uri or gw.metering_uri, "flush_s": gw.metering_flush_s},
        "retries": gw.retries,
        "max_body_bytes": gw.max_body_bytes,
    }


def render_gateway_config(settings: Settings, replicas: Mapping[str, list[str]] | None, **kwargs: Any) -> str:
    """The file, checked by the gateway's own model first."""
    text = yaml.safe_dump(gateway_document(settings, replicas, **kwargs), sort_keys=False)
    parse_config(text, source=f"gateway.yaml of stack {settings.stack}")
    return text


def static_replicas(settings: Settings) -> dict[str, list[str]]:
    """Each pool's runtimes on a static inventory: its hosts at its runtime's port."""
    return {
        pool.name: [
            f"http://{h.address}:{pool.runtime.port}" for h in settings.for_pool(pool.name).inventory.hosts
        ]
        for pool in settings.pools
    }


def new_tenant_key() -> tuple[str, str]:
    """A fresh API key and the secret's value that stores only its digest."""
    key = "sk-" + token_source.token_urlsafe(24)
    return key, json.dumps({"sha256": [hashlib.sha256(key.encode()).hexdigest()]})


def parse(text: str) -> GatewayConfig:
    return parse_config(text)


def build_gateway_wheel(out_dir: Path) -> Path:
    """The gateway's wheel, built from ``gateway/`` (what its hosts install)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    done = subprocess.run(
        [*command, "-w", str(out_dir), str(root() / "gateway")], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise FrontierError(f"building the gateway wheel failed:\n{(done.stderr or done.stdout)[-2000:]}")
    return max(out_dir.glob("frontier_gateway-*.whl"), key=lambda p: p.stat().st_mtime)


def publish(s3: Any, bucket: str, prefix: str, config_text: str, wheel: Path) -> list[str]:
    """Upload what gateway hosts boot from: ``<prefix>gateway/gateway.yaml`` and the wheel."""
    base = f"{prefix.rstrip('/')}/gateway/"
    s3.put_object(Bucket=bucket, Key=base + "gateway.yaml", Body=config_text.encode())
    s3.upload_file(str(wheel), bucket, base + wheel.name)
    return [f"s3://{bucket}/{base}gateway.yaml", f"s3://{bucket}/{base}{wheel.name}"]
