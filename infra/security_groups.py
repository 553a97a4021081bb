"""Security groups: who may reach whom.

- The ALB takes HTTPS (443) and the redirect port (80) from the stack's client ranges
  (``edge.allow_cidrs``; empty: anywhere on an internet-facing ALB, the VPC on an internal one), and
  talks only to its target port on the hosts: the TLS port of the hosts' HAProxy (``infra.edge``).
- Runtime hosts take the target port only from the ALB's group, the runtime port only from the
  monitoring group. The ALB forwards only ``/v1/*`` (its listener rules) and probes the readiness
  path of its targets, so ``/metrics`` answers only the monitoring side: a scraper the operator
  places in the monitoring group, and the host itself (its bootstrap publishes to CloudWatch from
  localhost). SSH comes only from the bastion's group when the stack names an
  ``inventory.ssh_gateway``; otherwise hosts take no SSH at all and are reached through Session
  Manager. Nodes of an EFA group also talk to each other on every port (EFA
  requires it), and only to members of the same group. Every pool's runtime port is opened so.
- A disaggregated pool's halves get a group each beside the runtime group: the prefill hosts take
  the KV transfer port (``runtime.kv_transfer.port``) from the decode hosts' group only, which may
  send there; a decode replica pulls the prompt's blocks from the prefill's listener, never the
  other way round.
- Behind a gateway, a pool with ``runtime.kv_events`` on opens its KV-event ports (publish and
  replay) on the runtime group to the gateway's group only, which alone subscribes
  (:mod:`infra.gateway`); without ``kv_events`` they stay closed.
- Runtime hosts send only HTTPS, and with ``network.egress: endpoints`` only to the VPC (its
  interface endpoints) and to S3 through the gateway endpoint's prefix list: no route to the internet
  is usable from them, whatever the route tables say. Gateway hosts get the same two rules
  (:meth:`SecurityGroups.confine_gateway`) beside their ways to the runtimes and the quota store.
- Nothing else accepts traffic from outside the VPC.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partialmethod
from typing import Literal

import pulumi
import pulumi_aws as aws

from infra.component import Component
from infra.doors import RuleResource
from infra.tags import RUNTIME_ROLE, with_tags

ANYWHERE = "0.0.0.0/0"
LISTENER_PORTS = (443, 80)  # HTTPS, and the port that only redirects to it


@dataclass(frozen=True)
class ProbeDoor:
    """The synthetic probe inside the VPC (``infra.probe.probe_door``): its HTTPS egress, and what the
    load balancer adds to admit it where its client ranges would not."""

    # The VPC (an internal balancer and the service endpoints) or anywhere, through the NATs.
    egress_cidr: str
    # An internal balancer that lists client ranges: it admits the probe's security group too.
    from_group: bool = False
    # An internet-facing balancer that lists client ranges: it admits the NATs' addresses on 443,
    # the address the probe's requests come from.
    from_addresses: Sequence[pulumi.Input[str]] = ()


@dataclass(frozen=True)
class SecurityGroupsArgs:
    vpc_id: pulumi.Input[str]
    # Every pool's runtime port (one stack may serve pools on different ports).
    runtime_ports: Sequence[int]
    bastion: bool
    efa: bool
    tags: Mapping[str, str]
    # False behind a gateway: the ALB forwards to the gateway, which alone reaches the runtimes.
    alb_to_runtime: bool = True
    # Where the ALB admits clients from: the stack's ``edge.client_cidrs``.
    alb_sources: Sequence[str] = (ANYWHERE,)
    # The port the ALB forwards to on the runtime hosts (their TLS port); None: the runtime port.
    alb_target_port: int | None = None
    # network.egress: "endpoints" confines runtime hosts to the VPC and S3's prefix list.
    egress: Literal["endpoints", "internet"] = "internet"
    vpc_cidr: str = ""
    s3_prefix_list_id: pulumi.Input[str] | None = None
    # Disaggregated pools: the door from each decode group to its prefill group.
    kv_transfers: Sequence[KvTransferDoor] = ()
    # The synthetic probe, where it runs inside the VPC; None: it calls from AWS's network.
    probe: ProbeDoor | None = None


@dataclass(frozen=True)
class KvTransferDoor:
    """A disaggregated pool's transfer port: its prefill group's hosts listen there, its decode
    group's hosts pull from it."""

    prefill_group: str
    decode_group: str
    port: int


class SecurityGroups(Component[SecurityGroupsArgs]):
    alb_id: pulumi.Output[str]
    runtime_id: pulumi.Output[str]
    monitoring_id: pulumi.Output[str]
    bastion_id: pulumi.Output[str] | None
    # Node group -> the group of its half of a disaggregated pool, which its hosts join too.
    role_ids: dict[str, pulumi.Output[str]]

    def __init__(
        self, name: str, args: SecurityGroupsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("frontier:security:SecurityGroups", name, args, opts)
        tags, ports = dict(args.tags), sorted(set(args.runtime_ports))
        listed = ", ".join(str(p) for p in ports)

        alb = self._group(
            "alb",
            "Load balancer: HTTPS and the HTTP redirect from the internet",
            args.vpc_id,
            with_tags(tags, role="load-balancer"),
        )
        runtime = self._group(
            "runtime",
            f"Runtime hosts: port {listed} from the load balancer only",
            args.vpc_id,
            with_tags(tags, role=RUNTIME_ROLE),
        )

        for listener_port in LISTENER_PORTS:
            for index, cidr in enumerate(args.alb_sources):
                # The first range keeps the rule's original name, so an open ALB is not replaced.
                self._ingress(
                    f"alb-{listener_port}" + (f"-{index}" if index else ""),
                    alb,
                    listener_port,
                    cidr=cidr,
                    description=f"Clients on {listener_port} (80 only redirects to HTTPS)",
                )
        self.probe_id = self._probe(alb, args.probe) if args.probe is not None else None
        if args.alb_to_runtime:
            target = args.alb_target_port or ports[0]
            self._egress(
                f"alb-to-runtime-{target}", alb, target, group=runtime, description="Forward to the hosts"
            )
            self._ingress(
                f"runtime-{target}-from-alb", runtime, target, group=alb, description="Requests from the ALB"
            )

        monitoring = self._group(
            "monitoring",
            f"Monitoring: scrapes /metrics on port {listed} of the runtime hosts",
            args.vpc_id,
            with_tags(tags, role="monitoring"),
        )
        for port in ports:
            self._ingress(
                f"runtime-{port}-from-monitoring",
                runtime,
                port,
                group=monitoring,
                description="Metrics scrapes from the monitoring side",
            )
            self._egress(
                f"monitoring-to-runtime-{port}",
                monitoring,
                port,
                group=runtime,
                description="Scrape /metrics",
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

        self._runtime_egress(runtime, args)
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

        self.role_ids = self._kv_transfers(args)
        self.alb_id, self.runtime_id = alb.id, runtime.id
        self.register_outputs({"alb": alb.id, "runtime": runtime.id, "bastion": self.bastion_id})

    def _kv_transfers(self, args: SecurityGroupsArgs) -> dict[str, pulumi.Output[str]]:
        """A group per disaggregated half; the prefill's transfer port open to its decode's group only."""
        ids: dict[str, pulumi.Output[str]] = {}
        for door in args.kv_transfers:
            prefill = self._group(
                f"kv-{door.prefill_group}",
                f"Prefill hosts of {door.prefill_group}: KV transfer port {door.port} from {door.decode_group} only",
                args.vpc_id,
                with_tags(dict(args.tags), role="kv-transfer"),
            )
            decode = self._group(
                f"kv-{door.decode_group}",
                f"Decode hosts of {door.decode_group}: pull KV blocks from {door.prefill_group}",
                args.vpc_id,
                with_tags(dict(args.tags), role="kv-transfer"),
            )
            self._ingress(
                f"kv-{door.prefill_group}-{door.port}-from-{door.decode_group}",
                prefill,
                door.port,
                group=decode,
                description="KV blocks pulled by the decode replicas",
            )
            self._egress(
                f"kv-{door.decode_group}-to-{door.prefill_group}-{door.port}",
                decode,
                door.port,
                group=prefill,
                description="Pull KV blocks from the prefill replicas",
            )
            ids[door.prefill_group], ids[door.decode_group] = prefill.id, decode.id
        return ids

    def _runtime_egress(self, runtime: aws.ec2.SecurityGroup, args: SecurityGroupsArgs) -> None:
        if args.egress == "internet":
            # Drivers, container images, weights and the AWS APIs: HTTPS out, plus HTTP for apt's signed mirrors.
            for egress_port in (443, 80):
                self._egress(
                    f"runtime-out-{egress_port}",
                    runtime,
                    egress_port,
                    cidr=ANYWHERE,
                    description="Packages, images, weights and AWS APIs",
                )
            return
        # Security groups do not filter the VPC's DNS resolver or the instance metadata service, so
        # these two rules are all a host needs to resolve and reach every endpoint.
        self._egress(
            "runtime-out-443-vpc",
            runtime,
            443,
            cidr=args.vpc_cidr,
            description="AWS APIs through the VPC's interface endpoints",
        )
        self._egress(
            "runtime-out-443-s3",
            runtime,
            443,
            prefix_list=args.s3_prefix_list_id,
            description="Weights, releases and host tools: S3 through the gateway endpoint",
        )

    def confine_gateway(self, gateway_id: pulumi.Input[str]) -> None:
        """With ``network.egress: endpoints``, the gateway hosts' way to AWS: its APIs through the
        VPC's interface endpoints (Secrets Manager for keys and the quota store's token, EC2 to find
        the runtimes, CloudWatch, SSM) and S3 (metering, host tools) through the gateway endpoint's
        prefix list, as for runtime hosts. Their ways to the runtimes and to the quota store are
        the rules of those doors (:mod:`infra.gateway`, :mod:`infra.quota_store`)."""
        if self._args.egress != "endpoints":
            return
        for key, target, description in (
            ("vpc", {"cidr_ipv4": self._args.vpc_cidr}, "AWS APIs through the VPC's interface endpoints"),
            ("s3", {"prefix_list_id": self._args.s3_prefix_list_id}, "Metering and host tools: S3"),
        ):
            aws.vpc.SecurityGroupEgressRule(
                f"{self._name}-gateway-out-443-{key}",
                security_group_id=gateway_id,
                ip_protocol="tcp",
                from_port=443,
                to_port=443,
                description=description,
                **target,
                opts=self._child,
            )

    def _probe(self, alb: aws.ec2.SecurityGroup, door: ProbeDoor) -> pulumi.Output[str]:
        """The probe's group (HTTPS out only) and the load balancer's rules that let it in."""
        args = self._args
        probe = self._group(
            "probe",
            "Synthetic probe: HTTPS to the load balancer and AWS's APIs",
            args.vpc_id,
            with_tags(dict(args.tags), role="probe"),
        )
        self._egress(
            "probe-https", probe, 443, cidr=door.egress_cidr, description="HTTPS: the endpoint, AWS's APIs"
        )
        if door.from_group:
            self._ingress("alb-443-from-probe", alb, 443, group=probe, description="The synthetic probe")
        for index, address in enumerate(door.from_addresses):
            self._ingress(
                f"alb-443-from-nat-{index}",
                alb,
                443,
                cidr=pulumi.Output.from_input(address).apply(lambda ip: f"{ip}/32"),
                description="The synthetic probe, through the VPC's NAT",
            )
        return probe.id

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

    def _rule_args(
        self,
        port: int | None,
        cidr: pulumi.Input[str] | None,
        group: aws.ec2.SecurityGroup | None,
        prefix_list: pulumi.Input[str] | None = None,
    ) -> dict:
        args: dict = (
            {"ip_protocol": "-1"}
            if port is None
            else {"ip_protocol": "tcp", "from_port": port, "to_port": port}
        )
        if cidr is not None:
            args["cidr_ipv4"] = cidr
        if group is not None:
            args["referenced_security_group_id"] = group.id
        if prefix_list is not None:
            args["prefix_list_id"] = prefix_list
        return args

    def _rule(
        self,
        make: RuleResource,
        key: str,
        owner: aws.ec2.SecurityGroup,
        port: int | None,
        *,
        description: str,
        cidr: pulumi.Input[str] | None = None,
        group: aws.ec2.SecurityGroup | None = None,
        prefix_list: pulumi.Input[str] | None = None,
    ) -> None:
        """One rule of ``owner``'s, made by ``make`` (an ingress or an egress rule: :attr:`_ingress`,
        :attr:`_egress`), on TCP ``port`` or on all traffic, with the peer ``cidr``, ``group`` or
        ``prefix_list``."""
        make(
            f"{self._name}-{key}",
            security_group_id=owner.id,
            description=description,
            **self._rule_args(port, cidr, group, prefix_list),
            opts=self._child,
        )

    _ingress = partialmethod(_rule, aws.vpc.SecurityGroupIngressRule)
    _egress = partialmethod(_rule, aws.vpc.SecurityGroupEgressRule)
