"""Default-deny NetworkPolicies for the runtime's namespace, then exactly what the runtime needs.

In: the runtime port, only from the ingress (the ALB's subnets, or the ingress controller's pods),
Prometheus, and the API server (whose pod proxy the rollout gate reads ``/metrics`` through). Out:
DNS to kube-dns, HTTPS anywhere but the instance metadata service, and the EKS Pod Identity agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from frontier_hostside.names import INSTANCE_METADATA_CIDR

from frontier.config.schema import Settings
from frontier.targets.kubernetes.network import api_server_cidrs, ingress_source_cidrs
from frontier.targets.kubernetes.objects import Manifest, app_labels, app_name, kubernetes_of, selector

# EKS Pod Identity's agent on every node: plain HTTP on a link-local address that is not the
# instance metadata service.
POD_IDENTITY_AGENT = "169.254.170.23/32"


def _namespace_peer(name: str, pod_labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}},
        "podSelector": {"matchLabels": dict(pod_labels)},
    }


def network_policies(settings: Settings) -> list[Manifest]:
    """Default deny, then exactly what the runtime needs in and out."""
    k = kubernetes_of(settings)
    labels = app_labels(settings)
    deny = Manifest(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        "default-deny",
        k.namespace,
        {"spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}},
        labels=labels,
    )
    if k.ingress.kind == "alb":
        # IP targets: the ALB's own addresses, in subnets that hold no pod.
        front = [{"ipBlock": {"cidr": cidr}} for cidr in ingress_source_cidrs(settings)]
    else:
        front = [_namespace_peer(k.ingress.controller_namespace, k.ingress.controller_labels)]
    prometheus = [_namespace_peer(k.monitoring.prometheus_namespace, k.monitoring.prometheus_labels)]
    api_server = [{"ipBlock": {"cidr": cidr}} for cidr in api_server_cidrs(settings)]
    runtime_in = Manifest(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        f"{app_name(settings)}-ingress",
        k.namespace,
        {
            "spec": {
                "podSelector": {"matchLabels": selector(settings)},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {
                        "from": [*front, *prometheus, *api_server],
                        "ports": [{"protocol": "TCP", "port": settings.runtime.port}],
                    }
                ],
            }
        },
        labels=labels,
    )
    egress: list[dict[str, Any]] = [
        {
            "to": [_namespace_peer("kube-system", {"k8s-app": "kube-dns"})],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
        {
            # S3 (weights), Secrets Manager (API keys), STS and ECR: HTTPS anywhere but the
            # instance metadata service, whose node credentials are not the runtime's.
            "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [INSTANCE_METADATA_CIDR]}}],
            "ports": [{"protocol": "TCP", "port": 443}],
        },
    ]
    if k.identity == "pod_identity":
        egress.append(
            {"to": [{"ipBlock": {"cidr": POD_IDENTITY_AGENT}}], "ports": [{"protocol": "TCP", "port": 80}]}
        )
    runtime_out = Manifest(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        f"{app_name(settings)}-egress",
        k.namespace,
        {
            "spec": {
                "podSelector": {"matchLabels": selector(settings)},
                "policyTypes": ["Egress"],
                "egress": egress,
            }
        },
        labels=labels,
    )
    return [deny, runtime_in, runtime_out]
