"""Network reach: what may reach the hosts from the internet, and what the hosts may send to it
(infra/security_groups.py).

A rule may be inline in its security group, a ``SecurityGroupRule``, or one of the vpc ingress/egress
rule resources; every check here reads all three.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from frontier_hostside.names import ROLE_TAG, RUNTIME_ROLE
from pulumi_policy import EnforcementLevel, PolicyResource, ResourceValidationArgs

from policy.rules.reading import as_int, as_list, get, tags_of
from policy.rules.validation import of_type, resource_policy, stack_policy

ANYWHERE = ("0.0.0.0/0", "::/0")
PUBLIC_PORTS = (80, 443)
SECURITY_GROUP = ("aws:ec2/securityGroup:SecurityGroup",)
SECURITY_GROUP_RULE = ("aws:ec2/securityGroupRule:SecurityGroupRule",)
INGRESS_RULE = ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",)
EGRESS_RULE = ("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",)
LOAD_BALANCER_ROLE = "load-balancer"  # infra/security_groups.py tags the ALB's group with this role
PUBLIC_LB_PORT = 443


def _public_ingress_problem(protocol: Any, from_port: Any, to_port: Any, cidrs: Iterable[Any]) -> str | None:
    public = sorted({str(c) for c in cidrs if str(c) in ANYWHERE})
    if not public:
        return None
    low, high = as_int(from_port), as_int(to_port)
    if str(protocol).lower() in ("tcp", "6") and low == high and low in PUBLIC_PORTS:
        return None
    span = "all ports" if str(protocol) in ("-1", "all") else f"{protocol} {low}-{high}"
    return (
        f"ingress from {', '.join(public)} on {span}: only TCP 80 and 443 (the load balancer) may be public"
    )


def check_no_public_ingress(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    if args.resource_type in SECURITY_GROUP:
        for rule in as_list(get(props, "ingress")):
            cidrs = [*as_list(get(rule, "cidrBlocks")), *as_list(get(rule, "ipv6CidrBlocks"))]
            problem = _public_ingress_problem(
                get(rule, "protocol"), get(rule, "fromPort"), get(rule, "toPort"), cidrs
            )
            if problem:
                yield problem
        return
    if args.resource_type in SECURITY_GROUP_RULE:
        if get(props, "type") != "ingress":
            return
        cidrs = [*as_list(get(props, "cidrBlocks")), *as_list(get(props, "ipv6CidrBlocks"))]
        protocol = get(props, "protocol")
    else:
        cidrs = [c for c in (get(props, "cidrIpv4"), get(props, "cidrIpv6")) if c]
        protocol = get(props, "ipProtocol")
    problem = _public_ingress_problem(protocol, get(props, "fromPort"), get(props, "toPort"), cidrs)
    if problem:
        yield problem


def check_runtime_ingress(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    """Runtime hosts accept traffic only from other security groups (the ALB, the bastion, EFA peers)."""
    runtime_ids = {
        str(get(sg.props, "id"))
        for sg in of_type(resources, SECURITY_GROUP)
        if get(tags_of(sg.props), ROLE_TAG) == "runtime" and get(sg.props, "id")
    }
    for sg in of_type(resources, SECURITY_GROUP):
        if get(tags_of(sg.props), ROLE_TAG) == "runtime":
            for rule in as_list(get(sg.props, "ingress")):
                if as_list(get(rule, "cidrBlocks")) or as_list(get(rule, "ipv6CidrBlocks")):
                    yield (
                        sg,
                        "runtime security group accepts an address range; only security groups may reach it",
                    )
    for rule in of_type(resources, INGRESS_RULE + SECURITY_GROUP_RULE):
        if str(get(rule.props, "securityGroupId", default="")) not in runtime_ids:
            continue
        if rule.resource_type in SECURITY_GROUP_RULE and get(rule.props, "type") != "ingress":
            continue
        ranges = [get(rule.props, key) for key in ("cidrIpv4", "cidrIpv6", "prefixListId")]
        ranges += as_list(get(rule.props, "cidrBlocks")) + as_list(get(rule.props, "ipv6CidrBlocks"))
        if any(ranges):
            yield (
                rule,
                "runtime hosts accept an address range; only security groups (ALB, bastion) may reach them",
            )


# --- which groups may talk to the internet, and on what --------------------------------------------


def _group_roles(resources: Sequence[PolicyResource]) -> dict[str, str]:
    """Security group id -> its ``frontier:role`` tag (runtime, load-balancer, ...)."""
    return {
        str(get(sg.props, "id")): str(get(tags_of(sg.props), ROLE_TAG, default=""))
        for sg in of_type(resources, SECURITY_GROUP)
        if get(sg.props, "id")
    }


def open_rules(
    resources: Sequence[PolicyResource], direction: str
) -> Iterator[tuple[PolicyResource, str, str, int | None, int | None, list[str]]]:
    """Every rule in ``direction`` ("ingress"/"egress") open to 0.0.0.0/0 or ::/0: (the resource
    holding it, its group's role, protocol, from port, to port, the open ranges), whether the rule is
    inline in the group, a SecurityGroupRule or one of the vpc ingress/egress rule resources."""
    roles = _group_roles(resources)
    for sg in of_type(resources, SECURITY_GROUP):
        role = str(get(tags_of(sg.props), ROLE_TAG, default=""))
        for rule in as_list(get(sg.props, direction)):
            ranges = [*as_list(get(rule, "cidrBlocks")), *as_list(get(rule, "ipv6CidrBlocks"))]
            public = [str(c) for c in ranges if str(c) in ANYWHERE]
            if public:
                yield sg, role, str(get(rule, "protocol")), *_ports(rule), public
    separate = (INGRESS_RULE if direction == "ingress" else EGRESS_RULE) + SECURITY_GROUP_RULE
    for rule in of_type(resources, separate):
        if rule.resource_type in SECURITY_GROUP_RULE:
            if get(rule.props, "type") != direction:
                continue
            ranges = [*as_list(get(rule.props, "cidrBlocks")), *as_list(get(rule.props, "ipv6CidrBlocks"))]
            protocol = get(rule.props, "protocol")
        else:
            ranges = [get(rule.props, "cidrIpv4"), get(rule.props, "cidrIpv6")]
            protocol = get(rule.props, "ipProtocol")
        public = [str(c) for c in ranges if str(c) in ANYWHERE]
        if public:
            role = roles.get(str(get(rule.props, "securityGroupId", default="")), "")
            yield rule, role, str(protocol), *_ports(rule.props), public


def _ports(rule: Any) -> tuple[int | None, int | None]:
    return as_int(get(rule, "fromPort")), as_int(get(rule, "toPort"))


def single_tcp_port(protocol: str, low: int | None, high: int | None) -> int | None:
    return low if protocol.lower() in ("tcp", "6") and low == high else None


# The runtime hosts' HTTPS/HTTP to anywhere (infra/security_groups.py: runtime-out-443, runtime-out-80,
# for packages, images, weights and AWS APIs) exists only where a stack sets network.egress: internet
# (an AMI that installs its packages at boot); reported by the advisory rule below, and refused on
# production stacks (production-runtime-egress-to-endpoints).
RUNTIME_WEB_PORTS = (443, 80)


def check_runtime_egress(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for holder, role, protocol, low, high, public in open_rules(resources, "egress"):
        if role == RUNTIME_ROLE and single_tcp_port(protocol, low, high) not in RUNTIME_WEB_PORTS:
            yield holder, f"runtime hosts may send {protocol} {low}-{high} to {', '.join(public)}"


def check_runtime_web_egress(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for holder, role, protocol, low, high, public in open_rules(resources, "egress"):
        if role == RUNTIME_ROLE and single_tcp_port(protocol, low, high) in RUNTIME_WEB_PORTS:
            yield (
                holder,
                f"runtime hosts may send TCP {low} to {', '.join(public)}, not only to AWS endpoints",
            )


# The ALB's port 80 from anywhere (infra/security_groups.py: alb-80) only redirects to HTTPS
# (alb-http-redirects-to-https); it is reported by the advisory rule below rather than refused.
LB_REDIRECT_PORT = 80


def check_public_ingress(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for holder, role, protocol, low, high, public in open_rules(resources, "ingress"):
        port = single_tcp_port(protocol, low, high)
        if role == LOAD_BALANCER_ROLE and port in (PUBLIC_LB_PORT, LB_REDIRECT_PORT):
            continue
        yield (
            holder,
            f"{role or 'untagged'} group takes {protocol} {low}-{high} from {', '.join(public)}: "
            f"only the load balancer's {PUBLIC_LB_PORT} is public",
        )


def check_lb_redirect_port(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for holder, role, protocol, low, high, public in open_rules(resources, "ingress"):
        if role == LOAD_BALANCER_ROLE and single_tcp_port(protocol, low, high) == LB_REDIRECT_PORT:
            yield (
                holder,
                f"load balancer takes TCP {LB_REDIRECT_PORT} from {', '.join(public)} (a redirect only)",
            )


POLICIES = [
    resource_policy(
        "no-public-ingress",
        "Nothing but TCP 80/443 accepts traffic from 0.0.0.0/0 or ::/0.",
        SECURITY_GROUP + SECURITY_GROUP_RULE + INGRESS_RULE,
        check_no_public_ingress,
    ),
    stack_policy(
        "runtime-ingress-from-security-groups",
        "Runtime hosts are reachable only from the ALB's (and bastion's) security groups.",
        check_runtime_ingress,
    ),
    stack_policy(
        "runtime-egress-not-anywhere",
        "Runtime hosts send nothing to 0.0.0.0/0 or ::/0 (but HTTPS/HTTP, see the advisory rule).",
        check_runtime_egress,
        EnforcementLevel.MANDATORY,
    ),
    stack_policy(
        "runtime-web-egress-to-anywhere",
        "Runtime hosts' HTTPS/HTTP to 0.0.0.0/0 or ::/0, reported until they reach AWS through endpoints.",
        check_runtime_web_egress,
        EnforcementLevel.ADVISORY,
    ),
    stack_policy(
        "public-ingress-only-to-load-balancer",
        "Only the load balancer's group takes traffic from 0.0.0.0/0 or ::/0, and only on 443.",
        check_public_ingress,
        EnforcementLevel.MANDATORY,
    ),
    stack_policy(
        "lb-redirect-port-public",
        "The load balancer's HTTP redirect port taking traffic from anywhere, reported.",
        check_lb_redirect_port,
        EnforcementLevel.ADVISORY,
    ),
]
