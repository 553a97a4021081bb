"""The gateway's ``gateway.yaml`` for a stack: its pools and replicas, its tenants, its settings.

Written from a validated instance of the gateway's own config model (whose settings part is the
stack's ``gateway:`` section), so a file the gateway would refuse never ships.
Tenants are written with their Secrets Manager secret (digests only), never with a key.
"""

from __future__ import annotations

import hashlib
import json
import secrets as token_source
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from frontier_gateway.config import GatewayConfig, GatewaySettings
from frontier_runtime.storage.manifest import version_prefix
from frontier_settings import problems_of, to_yaml
from pydantic import ValidationError

from frontier.config.schema import NodeGroup, PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.project import root


def gateway_config(
    settings: Settings,
    replicas: Mapping[str, list[str]] | None,
    *,
    metering_uri: str | None = None,
    disaggregated: Mapping[str, Mapping[str, list[str]]] | None = None,
    discoveries: Mapping[str, Mapping[str, Any]] | None = None,
) -> GatewayConfig:
    """The gateway's config for a stack: its gateway section as written, plus its pools (each with
    its runtimes' key secret), tenants and probe path. ``replicas``: base URLs of each model's
    runtimes, or None to find them on EC2 by their tags (each pool's node group). ``disaggregated``: a disaggregated
    pool's prefill and decode base URLs by model (``{"prefill": [...], "decode": [...]}``);
    ``discoveries``: where the gateway finds a pool's runtimes itself, by model (a Kubernetes pool's
    EndpointSlices), in place of its ``replicas``."""
    gw = settings.gateway
    if gw is None:
        raise FrontierError(f"stack {settings.stack!r} has no 'frontier:gateway' section")
    models: list[dict[str, Any]] = []
    # Each model's offline pool, where one takes its batch work.
    offline = {pool.offline_for: pool.name for pool in settings.pools if pool.offline_for}
    for pool in settings.pools:
        # The gateway calls each pool's runtimes with the key of that pool's own secret.
        secret = {"api_keys_secret": pool.runtime.api_keys_secret or "", **kv_routing(pool)}
        if pool.name in offline:
            secret["offline"] = offline[pool.name]
        if replicas is None:
            models.append({**discovered_pool(settings, pool), **secret})
            continue
        if discoveries and pool.name in discoveries:
            models.append({"name": pool.name, "discovery": dict(discoveries[pool.name]), **secret})
            continue
        urls = list(replicas.get(pool.name) or ())
        if not urls:
            raise FrontierError(f"model {pool.name!r} of stack {settings.stack!r} has no replica address")
        halves = (disaggregated or {}).get(pool.name)
        models.append(
            {"name": pool.name, "replicas": urls, **({"disaggregation": halves} if halves else {}), **secret}
        )
    section = gw.model_dump(include=set(GatewaySettings.model_fields))
    if metering_uri:
        section["metering"] = {**section["metering"], "uri": metering_uri}
    try:
        return GatewayConfig.model_validate(
            {
                **section,
                "models": models,
                "tenants": [tenant.model_dump() for tenant in settings.tenants],
                "readiness_path": settings.health.readiness_path,
            }
        )
    except ValidationError as exc:
        lines = "\n".join(f"  {p}" for p in problems_of(exc))
        raise FrontierError(f"the gateway refuses the config of stack {settings.stack!r}:\n{lines}") from None


def kv_routing(pool: PoolSettings) -> dict[str, Any]:
    """``pool``'s ``kv_routing`` where its runtimes publish KV events, read off its own runtime
    section (block size, both ports) and weights version (the tokenizer), never written twice."""
    events = pool.runtime.kv_events
    if not events.enabled:
        return {}
    return {
        "kv_routing": {
            "tokenizer_source": tokenizer_source(pool),
            "block_size": pool.runtime.block_size,
            "events_port": events.port,
            "replay_port": events.replay_port,
        }
    }


def tokenizer_source(pool: PoolSettings) -> str:
    """Where the gateway fetches ``pool``'s tokenizer files at start: the weights version its
    runtimes load (``weights.push`` uploads the model directory, tokenizer files included)."""
    bucket, prefix = version_prefix(pool.model.weights_uri, pool.model.version)
    return f"s3://{bucket}/{prefix}"


def discovered_pool(settings: Settings, pool: PoolSettings) -> dict[str, Any]:
    """``pool``'s entry where the gateway finds its runtimes on EC2 by their tags: its node group's
    hosts, or a disaggregated pool's prefill group's and decode group's, each half on its own."""

    def on(group: NodeGroup) -> dict[str, Any]:
        return {
            "stack": settings.stack,
            "node_group": group.name,
            "port": pool.runtime.port,
            "region": settings.region,
        }

    if pool.disaggregation is None:
        return {"name": pool.name, "discovery": on(pool.group)}
    halves = {
        "prefill_discovery": on(pool.disaggregation.prefill.group),
        "decode_discovery": on(pool.disaggregation.decode.group),
    }
    return {"name": pool.name, "disaggregation": halves}


def render_gateway_config(settings: Settings, replicas: Mapping[str, list[str]] | None, **kwargs: Any) -> str:
    """``gateway.yaml``: the validated gateway config, every field written out."""
    return to_yaml(gateway_config(settings, replicas, **kwargs))


def static_replicas(settings: Settings) -> dict[str, list[str]]:
    """Each pool's runtimes on a static inventory: its hosts at its runtime's port."""
    return {
        pool.name: [f"http://{h.address}:{pool.runtime.port}" for h in pool.hosts] for pool in settings.pools
    }


def new_tenant_key() -> tuple[str, str]:
    """A fresh API key and the secret's value that stores only its digest."""
    key = "sk-" + token_source.token_urlsafe(24)
    return key, json.dumps({"sha256": [hashlib.sha256(key.encode()).hexdigest()]})


# What gateway hosts install together (``pip install *.whl``): the gateway's wheel and those of our
# distributions it depends on, which no package index has, so each comes from its file.
GATEWAY_DISTRIBUTIONS = {"frontier_hostside": "hostside", "frontier_gateway": "gateway"}


def build_gateway_wheels(out_dir: Path) -> list[Path]:
    """The wheels gateway hosts install, built from this checkout (``gateway/`` and what it needs)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    folders = [str(root() / folder) for folder in GATEWAY_DISTRIBUTIONS.values()]
    done = subprocess.run([*command, "-w", str(out_dir), *folders], capture_output=True, text=True)
    if done.returncode != 0:
        raise FrontierError(f"building the gateway wheels failed:\n{(done.stderr or done.stdout)[-2000:]}")
    return [
        max(out_dir.glob(f"{package}-*.whl"), key=lambda p: p.stat().st_mtime)
        for package in GATEWAY_DISTRIBUTIONS
    ]


def publish(s3: Any, bucket: str, prefix: str, config_text: str, wheels: Sequence[Path]) -> list[str]:
    """Upload what gateway hosts boot from: ``<prefix>gateway/gateway.yaml`` and the wheels."""
    base = f"{prefix.rstrip('/')}/gateway/"
    s3.put_object(Bucket=bucket, Key=base + "gateway.yaml", Body=config_text.encode())
    for wheel in wheels:
        s3.upload_file(str(wheel), bucket, base + wheel.name)
    return [f"s3://{bucket}/{base}gateway.yaml", *(f"s3://{bucket}/{base}{w.name}" for w in wheels)]
