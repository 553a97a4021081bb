"""Default-deny NetworkPolicies for the runtime's namespace, then exactly what each pod needs.

Runtimes, in: their port, only from the front (see below), Prometheus, and the API server (whose pod
proxy the rollout gate reads ``/metrics`` through). Out: DNS to kube-dns, HTTPS anywhere but the
instance metadata service, and the EKS Pod Identity agent.

The front is the ingress (the ALB's subnets, or the ingress controller's pods) in a stack without a
gateway. With one, the ingress reaches the gateway's public port only, and the runtimes take their
port from the gateway's pods only: ingress controller -> gateway -> runtimes. The gateway's admin
port (``/metrics``) admits Prometheus alone; out, the gateway reaches DNS, the pools' runtimes,
HTTPS (Secrets Manager, S3 metering, STS), the Pod Identity agent, a Redis quota store's port, and
the trace collector's port where tracing is on.

A pool whose runtimes publish their prefix cache's changes (``runtime.kv_events``) behind a gateway
also gets ``<app>-kv-events``: the event and replay ports from the gateway's pods only, which may
send there; without a gateway, or with the events off, the ports stay closed.

A disaggregated pool's halves each get the runtime's policies, and the pair the transfer port
between them only (:func:`frontier.targets.kubernetes.disaggregation.kv_transfer_policies`).

A pool whose replica spans several nodes also gets ``<app>-replica``: all TCP between its own pods,
in and out (the leader's step and store ports, and the ephemeral ports gloo and NCCL open between
every pair of ranks), and from nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from frontier_hostside.names import INSTANCE_METADATA_CIDR

from frontier.config.schema import PoolSettings, Settings
from frontier.targets.kubernetes import disaggregation as pd
from frontier.targets.kubernetes import gateway as gw
from frontier.targets.kubernetes import leader_workers as lw
from frontier.targets.kubernetes.network import api_server_cidrs, ingress_source_cidrs
from frontier.targets.kubernetes.objects import (
    Manifest,
    kubernetes_of,
    pool_policy,
    selector,
    stack_labels,
)

# EKS Pod Identity's agent on every node: plain HTTP on a link-local address that is not the
# instance metadata service.
POD_IDENTITY_AGENT = "169.254.170.23/32"


def _namespace_peer(name: str, pod_labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}},
        "podSelector": {"matchLabels": dict(pod_labels)},
    }


def network_policies(settings: Settings) -> list[Manifest]:
    """Default deny, then exactly what each pool's runtime (and the gateway) needs in and out."""
    k = kubernetes_of(settings)
    deny = Manifest(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        "default-deny",
        k.namespace,
        {"spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}},
        labels=stack_labels(),
    )
    front = front_peers(settings)
    # Without a gateway the runtimes take their port from the front, with one from its pods alone.
    from_gateway = [{"podSelector": {"matchLabels": gw.gateway_selector()}}]
    sources = front if settings.gateway is None else from_gateway
    runtimes = [
        policy for pool in gw.workload_pools(settings) for policy in runtime_policies(settings, pool, sources)
    ]
    replicas = [replica_policy(settings, pool) for pool in settings.pools if lw.replica_spans_nodes(pool)]
    if settings.gateway is None:
        return [deny, *runtimes, *replicas]
    kv_events = [
        kv_events_policy(settings, half, from_gateway)
        for pool in settings.pools
        if kv_event_ports(pool)
        for half in pd.role_pools(pool)
    ]
    pairs = [policy for pool in settings.pools for policy in pd.kv_transfer_policies(settings, pool)]
    return [deny, *runtimes, *kv_events, *replicas, *pairs, *gateway_policies(settings, front)]


def kv_event_ports(pool: PoolSettings) -> list[int]:
    """The ports a pool's runtimes publish KV events and answer replays on; none while off."""
    events = pool.runtime.kv_events
    return [events.port, events.replay_port] if events.enabled else []


def kv_events_policy(settings: Settings, pool: PoolSettings, subscribers: list[dict[str, Any]]) -> Manifest:
    """One pool's (or half's) KV-event ports (publish and replay), from ``subscribers`` only: the
    gateway."""
    ports = [{"protocol": "TCP", "port": port} for port in kv_event_ports(pool)]
    return pool_policy(
        pool, "kv-events", kubernetes_of(settings).namespace, ingress=[{"from": subscribers, "ports": ports}]
    )


def replica_policy(settings: Settings, pool: PoolSettings) -> Manifest:
    """``pool``'s pods to each other, every TCP port both ways: the ranks of a replica over several
    nodes meet on the leader's ports, then gloo and NCCL connect every pair on ephemeral ones."""
    pods = {"podSelector": {"matchLabels": selector(pool)}}
    all_tcp = [{"protocol": "TCP"}]  # no port: every port of the protocol
    return pool_policy(
        pool,
        "replica",
        kubernetes_of(settings).namespace,
        ingress=[{"from": [pods], "ports": all_tcp}],
        egress=[{"to": [pods], "ports": all_tcp}],
    )


def front_peers(settings: Settings) -> list[dict[str, Any]]:
    """Where the ingress's traffic comes from."""
    k = kubernetes_of(settings)
    if k.ingress.kind == "alb":
        # IP targets: the ALB's own addresses, in subnets that hold no pod.
        return [{"ipBlock": {"cidr": cidr}} for cidr in ingress_source_cidrs(settings)]
    return [_namespace_peer(k.ingress.controller_namespace, k.ingress.controller_labels)]


def _prometheus(settings: Settings) -> list[dict[str, Any]]:
    k = kubernetes_of(settings)
    return [_namespace_peer(k.monitoring.prometheus_namespace, k.monitoring.prometheus_labels)]


def common_egress(settings: Settings) -> list[dict[str, Any]]:
    """Out to DNS, AWS's APIs and the Pod Identity agent where the stack uses it: the way out of
    every pod of ours (runtimes, gateway, probe, log shipper), each policy adding its own peers."""
    k = kubernetes_of(settings)
    egress: list[dict[str, Any]] = [
        {
            "to": [_namespace_peer("kube-system", {"k8s-app": "kube-dns"})],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
        {
            # S3 (weights, metering), Secrets Manager (API keys), STS, ECR and CloudWatch Logs: HTTPS
            # anywhere but the instance metadata service, whose node credentials are not the pods'.
            "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [INSTANCE_METADATA_CIDR]}}],
            "ports": [{"protocol": "TCP", "port": 443}],
        },
    ]
    if k.identity == "pod_identity":
        egress.append(
            {"to": [{"ipBlock": {"cidr": POD_IDENTITY_AGENT}}], "ports": [{"protocol": "TCP", "port": 80}]}
        )
    return egress


def runtime_policies(settings: Settings, pool: PoolSettings, sources: list[dict[str, Any]]) -> list[Manifest]:
    """``pool``'s runtime (or a half's): its port from ``sources``, Prometheus and the API server;
    out as above."""
    namespace = kubernetes_of(settings).namespace
    api_server = [{"ipBlock": {"cidr": cidr}} for cidr in api_server_cidrs(settings)]
    runtime_in = {
        "from": [*sources, *_prometheus(settings), *api_server],
        "ports": [{"protocol": "TCP", "port": pool.runtime.port}],
    }
    return [
        pool_policy(pool, "ingress", namespace, ingress=[runtime_in]),
        pool_policy(pool, "egress", namespace, egress=common_egress(settings)),
    ]


def gateway_policies(settings: Settings, front: list[dict[str, Any]]) -> list[Manifest]:
    """The gateway: public port from the front, admin port from Prometheus; out to the runtimes."""
    k, section = kubernetes_of(settings), gw.gateway_of(settings)
    labels, pods = gw.gateway_labels(), {"matchLabels": gw.gateway_selector()}
    gateway_in = Manifest(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        f"{gw.GATEWAY_NAME}-ingress",
        k.namespace,
        {
            "spec": {
                "podSelector": pods,
                "policyTypes": ["Ingress"],
                "ingress": [
                    {"from": front, "ports": [{"protocol": "TCP", "port": section.port}]},
                    {
                        "from": _prometheus(settings),
                        "ports": [{"protocol": "TCP", "port": section.admin_port}],
                    },
                ],
            }
        },
        labels=labels,
    )
    to_runtimes = [
        {
            "to": [{"podSelector": {"matchLabels": selector(half)}}],
            # Requests on the runtime's port; KV-event subscriptions and replays where it publishes.
            "ports": [
                {"protocol": "TCP", "port": port} for port in (pool.runtime.port, *kv_event_ports(pool))
            ],
        }
        for pool in settings.pools
        for half in pd.role_pools(pool)
    ]
    egress = [*common_egress(settings), *to_runtimes]
    if section.quota.store == "redis":
        # The quota store (ElastiCache in the VPC): its port, inside the VPC only.
        port = urlparse(section.quota.redis_url).port or 6379
        egress.append(
            {
                "to": [{"ipBlock": {"cidr": settings.network.vpc_cidr}}],
                "ports": [{"protocol": "TCP", "port": port}],
            }
        )
    if section.tracing.endpoint:
        # The trace collector's OTLP port (443 is allowed above already).
        collector = urlparse(section.tracing.endpoint)
        port = collector.port or (443 if collector.scheme == "https" else 80)
        egress.append(
            {
                "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [INSTANCE_METADATA_CIDR]}}],
                "ports": [{"protocol": "TCP", "port": port}],
            }
        )
    gateway_out = Manifest(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        f"{gw.GATEWAY_NAME}-egress",
        k.namespace,
        {"spec": {"podSelector": pods, "policyTypes": ["Egress"], "egress": egress}},
        labels=labels,
    )
    return [gateway_in, gateway_out]
