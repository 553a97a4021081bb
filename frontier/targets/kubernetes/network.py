"""Address ranges the runtime's NetworkPolicy admits, for a cluster this stack creates; and who
may reach the Ingress's load balancer (:func:`ingress_access_annotations`).

``infra.network.plan_subnets`` splits ``network.vpc_cidr``: private subnets (nodes, hence pods, on
the VPC CNI) in the first half, public subnets (the ALB) at the start of the second half, each
zone's public subnet half the size of its private one, so they fill at most the second half's
first half. The EKS control plane gets its own two /28 subnets at the very top of the range, so
the policy can admit the API server (whose pod proxy the rollout gate reads /metrics through)
without admitting any pod. ``tests/kubernetes/test_network.py`` holds the two layouts together.
"""

from __future__ import annotations

import ipaddress

from frontier.config.schema import Kubernetes, Settings

CONTROL_PLANE_PREFIX = 28
CONTROL_PLANE_SUBNETS = 2  # EKS wants control-plane ENIs in at least two zones


def public_range(vpc_cidr: str) -> str:
    """The quarter of the VPC that holds the public subnets (and no pod)."""
    _, second = ipaddress.ip_network(vpc_cidr).subnets(prefixlen_diff=1)
    first_of_second, _ = second.subnets(prefixlen_diff=1)
    return str(first_of_second)


def control_plane_subnets(vpc_cidr: str) -> tuple[str, ...]:
    """The last /28s of the VPC: the EKS control plane's ENIs, nothing else."""
    vpc = ipaddress.ip_network(vpc_cidr)
    subnets = list(vpc.subnets(new_prefix=CONTROL_PLANE_PREFIX))
    return tuple(str(s) for s in subnets[-CONTROL_PLANE_SUBNETS:])


def ingress_source_cidrs(settings: Settings) -> tuple[str, ...]:
    """Where an ALB's IP targets are reached from: the stack's setting, else its public subnets."""
    k = settings.section(Kubernetes)
    return k.ingress.source_cidrs or (public_range(settings.network.vpc_cidr),)


def api_server_cidrs(settings: Settings) -> tuple[str, ...]:
    k = settings.section(Kubernetes)
    return k.cluster.api_server_cidrs or control_plane_subnets(settings.network.vpc_cidr)


# The AWS Load Balancer Controller's annotations for who reaches the ALB and how it reaches pods.
SCHEME_ANNOTATION = "alb.ingress.kubernetes.io/scheme"
INBOUND_CIDRS_ANNOTATION = "alb.ingress.kubernetes.io/inbound-cidrs"
BACKEND_PROTOCOL_ANNOTATION = "alb.ingress.kubernetes.io/backend-protocol"


def ingress_access_annotations(settings: Settings) -> dict[str, str]:
    """The ALB's scheme and the client ranges its security group admits, from the stack's ``edge``,
    as on EC2: the allowlist, else everyone (internet-facing) or the VPC (internal).

    Pods serve plain HTTP: the hop from the ALB stays inside the VPC, and the runtime's
    NetworkPolicy admits it only from the ALB's subnets (:func:`ingress_source_cidrs`), so no pod
    holds a private key. An internal ALB goes where the controller finds subnets tagged
    ``kubernetes.io/role/internal-elb``; those must lie in :func:`ingress_source_cidrs` too.
    """
    edge = settings.edge
    return {
        SCHEME_ANNOTATION: edge.scheme,
        INBOUND_CIDRS_ANNOTATION: ",".join(edge.client_cidrs(settings.network.vpc_cidr)),
        BACKEND_PROTOCOL_ANNOTATION: "HTTP",
    }
