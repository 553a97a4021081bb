"""The ranges the NetworkPolicy admits hold the ALB and the control plane, and never a pod.

``infra.network.plan_subnets`` lays out the VPC a created cluster lives in; the policy's ranges
come from :mod:`frontier.targets.kubernetes.network`. These tests hold the two layouts together.
"""

from __future__ import annotations

import ipaddress

import pytest

from frontier.targets.kubernetes.network import control_plane_subnets, public_range
from infra.network import plan_subnets


@pytest.mark.parametrize("vpc", ["10.50.0.0/16", "10.0.0.0/18", "172.16.0.0/20", "192.168.0.0/22"])
@pytest.mark.parametrize("zones", [2, 3, 4, 5, 6])
def test_public_range_holds_every_public_subnet_and_no_private_one(vpc, zones):
    plan = plan_subnets(vpc, zones)
    public = ipaddress.ip_network(public_range(vpc))
    assert all(ipaddress.ip_network(s).subnet_of(public) for s in plan.public)
    assert not any(ipaddress.ip_network(s).overlaps(public) for s in plan.private)
    for cidr in control_plane_subnets(vpc):
        block = ipaddress.ip_network(cidr)
        assert block.subnet_of(ipaddress.ip_network(vpc))
        assert not any(block.overlaps(ipaddress.ip_network(s)) for s in (*plan.public, *plan.private))
