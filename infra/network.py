"""Network: a VPC over the stack's AZs, public and private subnets, NAT, VPC endpoints, flow logs.

Layout (awsx's defaults, sized to the stack): the VPC's first half holds one private subnet per AZ,
the second half one smaller public subnet per AZ, leaving room to grow. Only the ALB and the NAT
gateways live in public subnets; GPU hosts never get a public address.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import pulumi
import pulumi_aws as aws

from frontier.identity.documents import trust
from infra.cloud import Cloud
from infra.component import Component
from infra.errors import ProvisionError
from infra.tags import with_tags

# AWS refuses subnets smaller than /28.
SMALLEST_SUBNET_PREFIX = 28
# Interface endpoints: every AWS API a runtime host calls (image pulls, its API keys, its logs and
# metrics, credentials, the launch hook), so that with network.egress "endpoints" hosts reach AWS
# without a route to the internet, and with "internet" the calls stay off the NAT's per-GB bill.
INTERFACE_ENDPOINTS = (
    "ecr.api",
    "ecr.dkr",
    "secretsmanager",
    "logs",
    "monitoring",
    "sts",
    "autoscaling",
    # The gateway finds each pool's runtimes with DescribeInstances (frontier_gateway.discovery).
    "ec2",
)
# Session Manager's endpoints, added when hosts are reached over SSM instead of a bastion.
SSM_ENDPOINTS = ("ssm", "ssmmessages", "ec2messages")


@dataclass(frozen=True)
class SubnetPlan:
    private: tuple[str, ...]
    public: tuple[str, ...]


def plan_subnets(vpc_cidr: str, zones: int) -> SubnetPlan:
    """Private subnets split the first half of the VPC, public ones (half their size) the second."""
    vpc = ipaddress.ip_network(vpc_cidr)
    bits = max(1, math.ceil(math.log2(zones)))
    private_prefix = vpc.prefixlen + 1 + bits
    public_prefix = private_prefix + 1
    if public_prefix > SMALLEST_SUBNET_PREFIX:
        raise ProvisionError(
            f"network.vpc_cidr = {vpc_cidr!r}: too small for {zones} availability zones with a public and a "
            f"private subnet each (public subnets would be /{public_prefix}, AWS allows /{SMALLEST_SUBNET_PREFIX} "
            "at most); use a larger range or fewer network.availability_zones"
        )
    first, second = vpc.subnets(prefixlen_diff=1)
    private = list(first.subnets(new_prefix=private_prefix))[:zones]
    public = list(second.subnets(new_prefix=public_prefix))[:zones]
    return SubnetPlan(private=tuple(map(str, private)), public=tuple(map(str, public)))


@dataclass(frozen=True)
class NetworkArgs:
    stack: str
    cloud: Cloud
    cidr: str
    zones: Sequence[str]
    nat: Literal["single", "per_az"]
    ssm_access: bool
    log_key_arn: pulumi.Input[str]
    log_retention_days: int
    tags: Mapping[str, str]


class Network(Component[NetworkArgs]):
    vpc_id: pulumi.Output[str]
    vpc_cidr: str
    public_subnet_ids: list[pulumi.Output[str]]
    private_subnet_ids: list[pulumi.Output[str]]
    nat_gateway_ids: list[pulumi.Output[str]]
    # The NATs' public addresses: where the private subnets' traffic to the internet comes from.
    nat_public_ips: list[pulumi.Output[str]]
    # The S3 gateway endpoint's prefix list (pl-...): S3's address ranges in the region, which a
    # security group's egress can name where the gateway endpoint carries the traffic.
    s3_prefix_list_id: pulumi.Output[str]
    endpoints_security_group_id: pulumi.Output[str]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:network:Network", name, args, opts)
        tags = dict(args.tags)
        plan = plan_subnets(args.cidr, len(args.zones))

        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=args.cidr,
            enable_dns_support=True,
            enable_dns_hostnames=True,  # interface endpoints' private DNS needs both
            tags=tags | {"Name": name},
            opts=self._child,
        )
        self.vpc_id, self.vpc_cidr = vpc.id, args.cidr
        # Adopting the default security group with no rules empties it: nothing can use it by accident.
        aws.ec2.DefaultSecurityGroup(f"{name}-default-sg", vpc_id=vpc.id, tags=tags, opts=self._child)

        self.public_subnet_ids = self._public_tier(vpc, plan.public)
        self.nat_gateway_ids = self._nat_gateways()
        private_route_tables = self._private_tier(vpc, plan.private)
        endpoint_sg = self._endpoints(vpc, private_route_tables)
        self.endpoints_security_group_id = endpoint_sg.id
        self._flow_logs(vpc)

        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "public_subnet_ids": self.public_subnet_ids,
                "private_subnet_ids": self.private_subnet_ids,
                "nat_gateway_ids": self.nat_gateway_ids,
                "endpoint_security_group_id": endpoint_sg.id,
            }
        )

    def _public_tier(self, vpc: aws.ec2.Vpc, cidrs: Sequence[str]) -> list[pulumi.Output[str]]:
        name, tags = self._name, dict(self._args.tags)
        igw = aws.ec2.InternetGateway(
            f"{name}-igw", vpc_id=vpc.id, tags=tags | {"Name": name}, opts=self._child
        )
        # One table routes every public subnet.
        table = self._route_table(
            vpc, "public", f"{name}-public", resource_name=f"{name}-public-rt", gateway_id=igw.id
        )
        return [
            self._subnet(vpc, "public", zone, cidr, table)
            for zone, cidr in zip(self._args.zones, cidrs, strict=True)
        ]

    def _nat_gateways(self) -> list[pulumi.Output[str]]:
        """One NAT per AZ (no AZ loses egress when another fails) or a single one to save cost."""
        name, tags = self._name, dict(self._args.tags)
        count = len(self._args.zones) if self._args.nat == "per_az" else 1
        ids, self.nat_public_ips = [], []
        for zone, subnet_id in list(zip(self._args.zones, self.public_subnet_ids, strict=True))[:count]:
            eip = aws.ec2.Eip(
                f"{name}-nat-{zone}",
                domain="vpc",
                tags=tags | {"Name": f"{name}-nat-{zone}"},
                opts=self._child,
            )
            nat = aws.ec2.NatGateway(
                f"{name}-nat-{zone}",
                allocation_id=eip.id,
                subnet_id=subnet_id,
                connectivity_type="public",
                tags=tags | {"Name": f"{name}-nat-{zone}"},
                opts=self._child,
            )
            ids.append(nat.id)
            self.nat_public_ips.append(eip.public_ip)
        return ids

    def _private_tier(self, vpc: aws.ec2.Vpc, cidrs: Sequence[str]) -> list[pulumi.Output[str]]:
        name = self._name
        self.private_subnet_ids, tables = [], []
        for index, (zone, cidr) in enumerate(zip(self._args.zones, cidrs, strict=True)):
            nat_id = self.nat_gateway_ids[index if self._args.nat == "per_az" else 0]
            table = self._route_table(vpc, "private", f"{name}-private-{zone}", nat_gateway_id=nat_id)
            self.private_subnet_ids.append(self._subnet(vpc, "private", zone, cidr, table))
            tables.append(table.id)
        return tables

    def _route_table(
        self,
        vpc: aws.ec2.Vpc,
        tier: str,
        label: str,
        *,
        resource_name: str | None = None,
        **default_route: pulumi.Input[str],
    ) -> aws.ec2.RouteTable:
        """A route table of ``tier``, named ``label`` (its resource too, unless ``resource_name``),
        whose default route goes out through ``default_route``: the internet gateway or a NAT gateway."""
        table = aws.ec2.RouteTable(
            resource_name or label,
            vpc_id=vpc.id,
            tags=with_tags(dict(self._args.tags), tier=tier) | {"Name": label},
            opts=self._child,
        )
        aws.ec2.Route(
            f"{label}-default",
            route_table_id=table.id,
            destination_cidr_block="0.0.0.0/0",
            **default_route,
            opts=self._child,
        )
        return table

    def _subnet(
        self, vpc: aws.ec2.Vpc, tier: str, zone: str, cidr: str, table: aws.ec2.RouteTable
    ) -> pulumi.Output[str]:
        """A subnet of ``tier`` in ``zone``, routed by ``table``; its id."""
        subnet = aws.ec2.Subnet(
            f"{self._name}-{tier}-{zone}",
            vpc_id=vpc.id,
            cidr_block=cidr,
            availability_zone=zone,
            # The ALB and NAT gateways get their own addresses; nothing launched here should.
            map_public_ip_on_launch=False,
            tags=with_tags(dict(self._args.tags), tier=tier) | {"Name": f"{self._name}-{tier}-{zone}"},
            opts=self._child,
        )
        aws.ec2.RouteTableAssociation(
            f"{self._name}-{tier}-{zone}", subnet_id=subnet.id, route_table_id=table.id, opts=self._child
        )
        return subnet.id

    def _endpoints(
        self, vpc: aws.ec2.Vpc, private_route_tables: list[pulumi.Output[str]]
    ) -> aws.ec2.SecurityGroup:
        name, args, tags = self._name, self._args, dict(self._args.tags)
        region = args.cloud.region
        # Weights are read from S3 through a gateway endpoint: free, and no NAT charge per GB.
        s3 = aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=f"com.amazonaws.{region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=private_route_tables,
            tags=tags | {"Name": f"{name}-s3"},
            opts=self._child,
        )
        self.s3_prefix_list_id = s3.prefix_list_id
        sg = aws.ec2.SecurityGroup(
            f"{name}-endpoints",
            vpc_id=vpc.id,
            description="Interface endpoints: HTTPS from inside the VPC only",
            tags=with_tags(tags, role="vpc-endpoints") | {"Name": f"{name}-endpoints"},
            opts=self._child,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-endpoints-https",
            security_group_id=sg.id,
            description="HTTPS from the VPC",
            ip_protocol="tcp",
            from_port=443,
            to_port=443,
            cidr_ipv4=args.cidr,
            opts=self._child,
        )
        services = INTERFACE_ENDPOINTS + (SSM_ENDPOINTS if args.ssm_access else ())
        for service in services:
            aws.ec2.VpcEndpoint(
                f"{name}-{service.replace('.', '-')}",
                vpc_id=vpc.id,
                service_name=f"com.amazonaws.{region}.{service}",
                vpc_endpoint_type="Interface",
                private_dns_enabled=True,
                subnet_ids=self.private_subnet_ids,
                security_group_ids=[sg.id],
                tags=tags | {"Name": f"{name}-{service}"},
                opts=self._child,
            )
        return sg

    def _flow_logs(self, vpc: aws.ec2.Vpc) -> None:
        name, args, tags = self._name, self._args, dict(self._args.tags)
        group = aws.cloudwatch.LogGroup(
            f"{name}-flow-logs",
            name=f"/frontier/{args.stack}/vpc-flow-logs",
            retention_in_days=args.log_retention_days,
            kms_key_id=args.log_key_arn,
            tags=tags,
            opts=self._child,
        )
        role = aws.iam.Role(
            f"{name}-flow-logs",
            description="VPC flow logs delivery into their own log group",
            assume_role_policy=trust(
                {"Service": args.cloud.service_principal("vpc-flow-logs")},
                {"StringEquals": {"aws:SourceAccount": args.cloud.account_id}},
            ),
            tags=tags,
            opts=self._child,
        )
        aws.iam.RolePolicy(
            f"{name}-flow-logs",
            role=role.id,
            policy=pulumi.Output.json_dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Sid": "WriteFlowLogs",
                            "Effect": "Allow",
                            "Action": [
                                "logs:CreateLogStream",
                                "logs:PutLogEvents",
                                "logs:DescribeLogStreams",
                            ],
                            "Resource": [group.arn, pulumi.Output.concat(group.arn, ":log-stream:*")],
                        },
                        {
                            "Sid": "FindTheGroup",
                            "Effect": "Allow",
                            "Action": "logs:DescribeLogGroups",
                            "Resource": args.cloud.arn("logs", "log-group:*"),
                        },
                    ],
                }
            ),
            opts=self._child,
        )
        aws.ec2.FlowLog(
            f"{name}-flow-logs",
            vpc_id=vpc.id,
            traffic_type="ALL",
            log_destination_type="cloud-watch-logs",
            log_destination=group.arn,
            iam_role_arn=role.arn,
            max_aggregation_interval=60,
            tags=tags,
            opts=self._child,
        )
