"""Security groups: who may reach whom.

- The ALB takes HTTPS (443) and the redirect port (80) from anywhere, and talks only to the runtime
  port of the hosts.
- Runtime hosts take the runtime port only from the ALB's group and the monitoring group. The ALB
  forwards only ``/v1/*`` (its listener rules) and probes the readiness path of its targets, so
  ``/metrics`` answers only the monitoring side: a scraper the operator places in the monitoring
  group, and the host itself (its bootstrap publishes to CloudWatch from localhost). SSH comes only from the bastion's
  group when the stack names an ``inventory.ssh_gateway``; otherwise hosts take no SSH at all and are
  reached through Session Manager. Nodes of an EFA group also talk to each other on every port (EFA
  requires it), and only to members of the same group.
- Nothing else accepts traffic from outside the VPC.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.tags import RUNTIME_ROLE, with_tags

ANYWHERE = "0.0.0.0/0"


@dataclass(frozen=True)
class SecurityGroupsArgs:
    vpc_id: pulumi.Input[str]
    runtime_port: int
    bastion: bool
    efa: bool
    tags: Mapping[str, str]
    # False behind a gateway: the ALB forwards to the gateway, which alone reaches the runtimes.
    alb_to_runtime: bool = True


class SecurityGroups(pulumi.ComponentResource):
    alb_id: pulumi.Output[str]
    runtime_id: pulumi.Output[str]
    monitoring_id: pulumi.Output[str]
    bastion_id: pulumi.Output[str] | None

    def __init__(
        self, name: str, args: SecurityGroupsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("frontier:security:SecurityGroups", name, None, opts)
        self._name, self._child = name, pulumi.ResourceOptions(parent=self)
        tags, port = dict(args.tags), args.runtime_port

        alb = self._group(
            "alb",
            "Load balancer: HTTPS and the HTTP redirect from the internet",
            args.vpc_id,
            with_tags(tags, role="load-balancer"),
        )
        runtime = self._group(
            "runtime",
            f"Runtime hosts: port {port} from the load balancer only",
            args.vpc_id,
            with_tags(tags, role=RUNTIME_ROLE),
        )

        for listener_port in (443, 80):
            self._ingress(
                f"alb-{listener_port}",
                alb,
                listener_port,
                cidr=ANYWHERE,
                description=f"Clients on {listener_port} (80 only redirects to HTTPS)",
            )
        if args.alb_to_runtime:
            self._egress(
                f"alb-to-runtime-{port}", alb, port, group=runtime, description="Forward to the runtime"
            )
            self._ingress(
                f"runtime-{port}-from-alb", runtime, port, group=alb, description="Requests from the ALB"
            )

        monitoring = self._group(
            "monitoring",
            f"Monitoring: scrapes /metrics on port {port} of the runtime hosts",
            args.vpc_id,
            with_tags(tags, role="monitoring"),
        )
        self._ingress(
            f"runtime-{port}-from-monitoring",
            runtime,
            port,
            group=monitoring,
            description="Metrics scrapes from the monitoring side",
        )
        self._egress(
            f"monitoring-to-runtime-{port}", monitoring, port, group=runtime, description="Scrape /metrics"
        )
        self.monitoring_id = monitoring.id
        self.bastion_id = None
        if args.bastion:
            # The bastion host itself (named by inventory.ssh_gateway) is the operator's; it joins this group
            # and brings its own narrow ingress. Hosts trust the group, never an address range.
            bastion = self._group(
                "bastion",
                "Bastion: the only source of SSH to runtime hosts",
                args.vpc_id,
                with_tags(tags, role="bastion"),
            )
            self._ingress(
                "runtime-ssh-from-bastion", runtime, 22, group=bastion, description="SSH from the bastion"
            )
            self._egress(
                "bastion-ssh-to-runtime", bastion, 22, group=runtime, description="SSH to runtime hosts"
            )
            self.bastion_id = bastion.id

        # Drivers, container images, weights and the AWS APIs: HTTPS out, plus HTTP for apt's signed mirrors.
        for egress_port in (443, 80):
            self._egress(
                f"runtime-out-{egress_port}",
                runtime,
                egress_port,
                cidr=ANYWHERE,
                description="Packages, images, weights and AWS APIs",
            )
        if args.efa:
            self._ingress(
                "runtime-efa-in",
                runtime,
                None,
                group=runtime,
                description="EFA: all traffic within the group",
            )
            self._egress(
                "runtime-efa-out",
                runtime,
                None,
                group=runtime,
                description="EFA: all traffic within the group",
            )

        self.alb_id, self.runtime_id = alb.id, runtime.id
        self.register_outputs({"alb": alb.id, "runtime": runtime.id, "bastion": self.bastion_id})

    def _group(
        self, key: str, description: str, vpc_id: pulumi.Input[str], tags: dict[str, str]
    ) -> aws.ec2.SecurityGroup:
        return aws.ec2.SecurityGroup(
            f"{self._name}-{key}",
            vpc_id=vpc_id,
            description=description,
            tags=tags | {"Name": f"{self._name}-{key}"},
            # Rules live in their own resources; an inline rule list here would fight them on every update.
            opts=self._child,
        )

    def _rule_args(self, port: int | None, cidr: str | None, group: aws.ec2.SecurityGroup | None) -> dict:
        args: dict = (
            {"ip_protocol": "-1"}
            if port is None
            else {"ip_protocol": "tcp", "from_port": port, "to_port": port}
        )
        if cidr is not None:
            args["cidr_ipv4"] = cidr
        if group is not None:
            args["referenced_security_group_id"] = group.id
        return args

    def _ingress(
        self,
        key: str,
        target: aws.ec2.SecurityGroup,
        port: int | None,
        *,
        description: str,
        cidr: str | None = None,
        group: aws.ec2.SecurityGroup | None = None,
    ) -> None:
        aws.vpc.SecurityGroupIngressRule(
            f"{self._name}-{key}",
            security_group_id=target.id,
            description=description,
            **self._rule_args(port, cidr, group),
            opts=self._child,
        )

    def _egress(
        self,
        key: str,
        source: aws.ec2.SecurityGroup,
        port: int | None,
        *,
        description: str,
        cidr: str | None = None,
        group: aws.ec2.SecurityGroup | None = None,
    ) -> None:
        aws.vpc.SecurityGroupEgressRule(
            f"{self._name}-{key}",
            security_group_id=source.id,
            description=description,
            **self._rule_args(port, cidr, group),
            opts=self._child,
        )
