"""Address ranges the runtime's NetworkPolicy admits, for a cluster this stack creates.

``infra.network.plan_subnets`` splits ``network.vpc_cidr``: private subnets (nodes, hence pods, on
the VPC CNI) in the first half, public subnets (the ALB) at the start of the second half, each
zone's public subnet half the size of its private one, so they fill at most the second half's
first half. The EKS control plane gets its own two /28 subnets at the very top of the range, so
the policy can admit the API server (whose pod proxy the rollout gate reads /metrics through)
without admitting any pod. ``tests/kubernetes/test_network.py`` holds the two layouts together.
"""

from __future__ import annotations

import ipaddress

from frontier.config.schema import Settings

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
    k = settings.kubernetes
    assert k is not None
    return k.ingress.source_cidrs or (public_range(settings.network.vpc_cidr),)


def api_server_cidrs(settings: Settings) -> tuple[str, ...]:
    k = settings.kubernetes
    assert k is not None
    return k.cluster.api_server_cidrs or control_plane_subnets(settings.network.vpc_cidr)
