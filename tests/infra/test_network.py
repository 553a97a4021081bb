"""Network: VPC over the stack's AZs, private hosts, NAT per the stack, endpoints, flow logs."""

from __future__ import annotations

import ipaddress

import pytest

from infra.errors import ProvisionError
from infra.network import INTERFACE_ENDPOINTS, SSM_ENDPOINTS, plan_subnets

SUBNET = "aws:ec2/subnet:Subnet"
ROUTE = "aws:ec2/route:Route"
ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"


def subnets(graph, tier):
    return [s for s in graph.of_type(SUBNET) if s.inputs["tags"]["frontier:tier"] == tier]


def default_route(graph, table):
    routes = [r for r in graph.of_type(ROUTE) if r.inputs["routeTableId"] == table.id]
    assert len(routes) == 1
    return routes[0].inputs


def test_vpc_uses_the_stacks_cidr_with_dns_for_private_endpoints(graph):
    vpc = graph.one("aws:ec2/vpc:Vpc").inputs
    assert vpc["cidrBlock"] == graph.settings.network.vpc_cidr
    assert vpc["enableDnsSupport"] and vpc["enableDnsHostnames"]


@pytest.mark.parametrize("tier", ["public", "private"])
def test_one_subnet_per_availability_zone_in_each_tier(graph, tier):
    zones = [s.inputs["availabilityZone"] for s in subnets(graph, tier)]
    assert len(zones) == len(set(zones)) == graph.settings.network.availability_zones


def test_subnets_lie_inside_the_vpc_and_do_not_overlap(graph):
    vpc = ipaddress.ip_network(graph.settings.network.vpc_cidr)
    cidrs = [ipaddress.ip_network(s.inputs["cidrBlock"]) for s in graph.of_type(SUBNET)]
    assert all(c.subnet_of(vpc) for c in cidrs)
    assert not any(a.overlaps(b) for i, a in enumerate(cidrs) for b in cidrs[i + 1 :])


def test_no_subnet_hands_out_public_addresses(graph):
    assert all(s.inputs["mapPublicIpOnLaunch"] is False for s in graph.of_type(SUBNET))


def test_nat_gateways_follow_the_stacks_nat_setting(graph):
    nats = graph.of_type("aws:ec2/natGateway:NatGateway")
    expected = graph.settings.network.availability_zones if graph.settings.network.nat == "per_az" else 1
    assert len(nats) == expected
    public_ids = {s.id for s in subnets(graph, "public")}
    assert all(n.inputs["subnetId"] in public_ids for n in nats)


def test_production_gives_each_zone_its_own_nat(prod):
    nat_zone = {
        n.id: prod.by_id(n.inputs["subnetId"]).inputs["availabilityZone"]
        for n in prod.of_type("aws:ec2/natGateway:NatGateway")
    }
    for subnet in subnets(prod, "private"):
        zone = subnet.inputs["availabilityZone"]
        table = prod.one("aws:ec2/routeTable:RouteTable", f"prod-network-private-{zone}")
        assert nat_zone[default_route(prod, table)["natGatewayId"]] == zone


def test_private_subnets_reach_out_only_through_nat(graph):
    for table in graph.of_type("aws:ec2/routeTable:RouteTable"):
        route = default_route(graph, table)
        if table.inputs["tags"]["frontier:tier"] == "private":
            assert "natGatewayId" in route and "gatewayId" not in route
        else:
            assert route["gatewayId"] == graph.one("aws:ec2/internetGateway:InternetGateway").id


def test_s3_gateway_endpoint_serves_every_private_route_table(graph):
    s3 = [e for e in graph.of_type(ENDPOINT) if e.inputs["vpcEndpointType"] == "Gateway"]
    assert [e.inputs["serviceName"] for e in s3] == [f"com.amazonaws.{graph.settings.region}.s3"]
    private_tables = {
        t.id
        for t in graph.of_type("aws:ec2/routeTable:RouteTable")
        if t.inputs["tags"]["frontier:tier"] == "private"
    }
    assert set(s3[0].inputs["routeTableIds"]) == private_tables


def test_interface_endpoints_for_ecr_secrets_and_logs_in_private_subnets(graph):
    interfaces = [e.inputs for e in graph.of_type(ENDPOINT) if e.inputs["vpcEndpointType"] == "Interface"]
    services = {e["serviceName"].rsplit(f"{graph.settings.region}.", 1)[1] for e in interfaces}
    ssm = set(SSM_ENDPOINTS) if graph.outputs["host_access"] == "ssm" else set()
    assert services == set(INTERFACE_ENDPOINTS) | ssm
    assert {"ecr.api", "ecr.dkr", "secretsmanager", "logs"} <= services
    private_ids = {s.id for s in subnets(graph, "private")}
    assert all(set(e["subnetIds"]) == private_ids and e["privateDnsEnabled"] for e in interfaces)


def test_interface_endpoints_accept_https_from_inside_the_vpc_only(graph):
    sg_id = graph.one("aws:ec2/securityGroup:SecurityGroup", f"{graph.stack}-network-endpoints").id
    rules = [
        r.inputs
        for r in graph.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        if r.inputs["securityGroupId"] == sg_id
    ]
    assert rules == [
        {
            "description": "HTTPS from the VPC",
            "ipProtocol": "tcp",
            "fromPort": 443,
            "toPort": 443,
            "cidrIpv4": graph.settings.network.vpc_cidr,
            "securityGroupId": sg_id,
        }
    ]


def test_the_default_security_group_is_emptied(graph):
    default = graph.one("aws:ec2/defaultSecurityGroup:DefaultSecurityGroup").inputs
    assert not default.get("ingress") and not default.get("egress")


def test_flow_logs_capture_all_traffic_into_an_encrypted_log_group(graph):
    flow = graph.one("aws:ec2/flowLog:FlowLog").inputs
    group = graph.one("aws:cloudwatch/logGroup:LogGroup", f"{graph.stack}-network-flow-logs")
    assert flow["trafficType"] == "ALL" and flow["vpcId"] == graph.outputs["vpc_id"]
    assert flow["logDestination"] == group.outputs["arn"]
    assert group.inputs["kmsKeyId"] == graph.outputs["kms_key_arn"]
    assert group.inputs["retentionInDays"] > 0


def test_subnet_plan_puts_larger_private_subnets_in_the_first_half():
    plan = plan_subnets("10.40.0.0/16", 3)
    assert plan.private == ("10.40.0.0/19", "10.40.32.0/19", "10.40.64.0/19")
    assert plan.public == ("10.40.128.0/20", "10.40.144.0/20", "10.40.160.0/20")


def test_a_vpc_too_small_for_its_zones_is_refused():
    with pytest.raises(ProvisionError, match=r"network\.vpc_cidr = '10\.0\.0\.0/24': too small for 6"):
        plan_subnets("10.0.0.0/24", 6)
