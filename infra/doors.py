"""A door between two security groups: the target group takes one TCP port from the source group,
and the source group may send there. Both rules are their own resources (an inline rule list on a
group would fight them on every update), each named by its caller so that its URN stays its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

RuleResource = Callable[..., pulumi.CustomResource]


@dataclass(frozen=True)
class Rule:
    """One side of a door: its resource name and what the console shows of it."""

    name: str
    description: str


def open_door(
    port: int,
    *,
    source: pulumi.Input[str],
    target: pulumi.Input[str],
    ingress: Rule,
    egress: Rule,
    opts: pulumi.ResourceOptions,
) -> None:
    """``target`` takes ``port`` from ``source`` (``ingress``), and ``source`` sends there (``egress``)."""
    # Each side: the rule's resource, its name and description, the group it belongs to, its peer.
    sides: list[tuple[RuleResource, Rule, pulumi.Input[str], pulumi.Input[str]]] = [
        (aws.vpc.SecurityGroupIngressRule, ingress, target, source),
        (aws.vpc.SecurityGroupEgressRule, egress, source, target),
    ]
    for make, rule, group, peer in sides:
        make(
            rule.name,
            security_group_id=group,
            referenced_security_group_id=peer,
            ip_protocol="tcp",
            from_port=port,
            to_port=port,
            description=rule.description,
            opts=opts,
        )
