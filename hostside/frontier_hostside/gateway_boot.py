"""A gateway host's bootstrap: ``publish-gateway`` (see ``bootstrap.py``), run by a systemd timer
(templates/gateway-cloud-init.yaml.j2) from the gateway's venv.

Configuration: ``KEY=VALUE`` lines of ``/etc/frontier/gateway.env``, read as a runtime host reads
its own (:mod:`frontier_hostside.node_boot`). Standard library only, Python 3.8 and later.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier_hostside.aws_cli import Aws, BootError
from frontier_hostside.names import (
    CLOUDWATCH_DIMENSIONS,
    GATEWAY_5XX_CW_METRIC,
    GATEWAY_NODE_GROUP,
    GATEWAY_REQUESTS_CW_METRIC,
)
from frontier_hostside.node_boot import parse_prometheus, read_env, required_env

GATEWAY_PUBLISHER_STATE = "gateway-publisher.json"


@dataclass(frozen=True)
class GatewayNodeConfig:
    """What ``publish-gateway`` reads: ``KEY=VALUE`` lines of ``/etc/frontier/gateway.env``, rendered
    by Frontier (``frontier.render.boot.gateway_env``)."""

    stack: str
    region: str
    root: str  # where the publisher keeps its state between runs
    metrics_url: str  # the gateway's admin /metrics
    ca_file: str  # the certificate the admin socket presents; "" for plain HTTP
    namespace: str
    held_metric: str
    waiting_series: str  # the hold queue's gauge {pool}
    requests_series: str  # the answered-requests counter {tenant, model, status}
    pools: dict[str, str]  # pool -> its node group

    @classmethod
    def load(cls, path: str) -> GatewayNodeConfig:
        env = read_env(Path(path))
        keys = {
            "stack": "FRONTIER_STACK",
            "region": "AWS_REGION",
            "root": "FRONTIER_ROOT",
            "metrics_url": "FRONTIER_GATEWAY_METRICS_URL",
            "namespace": "FRONTIER_METRIC_NAMESPACE",
            "held_metric": "FRONTIER_HELD_METRIC",
            "waiting_series": "FRONTIER_POOL_WAITING_SERIES",
            "requests_series": "FRONTIER_GATEWAY_REQUESTS_SERIES",
            "pools": "FRONTIER_GATEWAY_POOLS",
        }
        values = required_env(path, env, keys)
        pools = {}
        for item in values["pools"].split(","):
            pool, sep, group = item.partition("=")
            if not sep or not pool.strip() or not group.strip():
                raise BootError(
                    f"{path}: FRONTIER_GATEWAY_POOLS={values['pools']!r}: each item is pool=node_group, "
                    f"not {item!r}"
                )
            pools[pool.strip()] = group.strip()
        values["pools"] = pools
        values["ca_file"] = env.get("FRONTIER_GATEWAY_CA", "")
        return cls(**values)


def _scrape(url: str, ca_file: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of one /metrics page. Over HTTPS the host's own certificate is the one trusted
    authority, and it names the host, not 127.0.0.1, so the name is not checked."""
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=ca_file or None)
        context.check_hostname = False
    with urllib.request.urlopen(url, timeout=5, context=context) as answer:
        return parse_prometheus(answer.read().decode())


def counted_since(before: dict[str, float], now: dict[str, float]) -> dict[str, float]:
    """Counter increases since ``before``, per series; a restarted gateway (any count lower than
    before) counts from zero."""
    if any(now.get(key, 0.0) < value for key, value in before.items()):
        before = {}
    return {key: value - before.get(key, 0.0) for key, value in now.items()}


def publish_gateway(config: GatewayNodeConfig, aws: Aws) -> dict[str, Any]:
    samples = _scrape(config.metrics_url, config.ca_file)
    held = dict.fromkeys(config.pools, 0.0)
    for name, labels, value in samples:
        if name == config.waiting_series and labels.get("pool") in held:
            held[labels["pool"]] += value
    # Answered requests by status, summed over tenants and models: the gateway's own figures.
    answered: dict[str, float] = {}
    for name, labels, value in samples:
        if name == f"{config.requests_series}_total":
            status = labels.get("status", "")
            answered[status] = answered.get(status, 0.0) + value
    state_path = Path(config.root) / "run" / GATEWAY_PUBLISHER_STATE
    before: dict[str, float] | None
    try:
        state = json.loads(state_path.read_text())
        before = {str(k): float(v) for k, v in state.get("answered", {}).items()}
    except (OSError, ValueError, AttributeError):
        before = None
    # The first publish on a host has nothing to count from: it only sets the baseline.
    since = counted_since(before, answered) if before is not None else dict.fromkeys(answered, 0.0)
    requests = sum(since.values())
    errors = sum(count for status, count in since.items() if status.startswith("5"))
    stack_dimension, group_dimension = CLOUDWATCH_DIMENSIONS

    def dimensions(group: str) -> list[dict[str, str]]:
        return [{"Name": stack_dimension, "Value": config.stack}, {"Name": group_dimension, "Value": group}]

    data: list[dict[str, Any]] = [
        {
            "MetricName": config.held_metric,
            "Dimensions": dimensions(config.pools[pool]),
            "Value": count,
            "Unit": "Count",
        }
        for pool, count in sorted(held.items())
    ]
    data += [
        {"MetricName": GATEWAY_REQUESTS_CW_METRIC, "Dimensions": dimensions(GATEWAY_NODE_GROUP), "Value": requests, "Unit": "Count"},
        {"MetricName": GATEWAY_5XX_CW_METRIC, "Dimensions": dimensions(GATEWAY_NODE_GROUP), "Value": errors, "Unit": "Count"},
    ]  # fmt: skip
    aws.put_metrics(config.namespace, data)
    state_path.parent.mkdir(parents=True, exist_ok=True)
    state_path.write_text(json.dumps({"answered": answered}))
    return {"ok": True, "held": held, "requests": requests, "errors_5xx": errors}
