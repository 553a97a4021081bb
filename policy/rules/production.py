"""Production stacks (those whose file says ``frontier:production: true``, read through
:func:`frontier.config.checks.is_production` as infra/ reads it; the pack's ``productionStacks``
config names others in their place): what outlives a release is protected from deletion, and the
doors stay closed: who reaches the balancer, how it reaches the hosts, where the hosts may send
(infra/edge.py, infra/security_groups.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from frontier_hostside.names import PURPOSE_TAG, RUNTIME_ROLE, STACK_TAG
from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    StackValidationArgs,
    StackValidationPolicy,
)

from frontier.config.checks import is_production
from frontier.config.load import available_stacks
from frontier.project import stacks_dir
from frontier.targets import load_stack
from frontier.targets.kubernetes.network import INBOUND_CIDRS_ANNOTATION, SCHEME_ANNOTATION
from policy.rules.edge import LOAD_BALANCER, TARGET_GROUP, WEB_ACL_ASSOCIATION
from policy.rules.kubernetes import EKS_CLUSTER, K8S_INGRESS
from policy.rules.network import SECURITY_GROUP, open_rules
from policy.rules.reading import as_list, get, stack_of, tags_of, truthy
from policy.rules.storage import BUCKET, ECR_REPOSITORY, KMS_KEY, SECRET
from policy.rules.validation import of_type, resource_policy

# No default: without the key, the stack files decide (declared_production).
PRODUCTION_SCHEMA = PolicyConfigSchema(
    properties={"productionStacks": {"type": "array", "items": {"type": "string"}}}
)
# What outlives a release: losing one loses weights, history, keys, secrets, images or the cluster.
STATEFUL = BUCKET + KMS_KEY + SECRET + ECR_REPOSITORY + EKS_CLUSTER
STATEFUL_MANDATORY = tuple(t for t in STATEFUL if t not in ECR_REPOSITORY)


def declared_production(stack: str) -> bool:
    """Whether the stack's file declares it production, as infra/ reads it; a stack without a file
    here (one the pack is tried on elsewhere) is not."""
    return _declared(str(stacks_dir()), stack)


@functools.cache
def _declared(stacks: str, stack: str) -> bool:
    return stack in available_stacks() and is_production(load_stack(stack))


def production_stacks(config: Mapping[str, Any] | None) -> Callable[[str], bool]:
    """Which stacks the production rules apply to: those the pack's ``productionStacks`` config
    names where it is set (to rehearse a rule on another stack), else those declared production."""
    named = get(config or {}, "productionStacks")
    if named is None:
        return declared_production
    return frozenset(str(stack) for stack in as_list(named)).__contains__


def check_production_protected(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    stack = stack_of(args.urn)
    if not production_stacks(args.get_config())(stack):
        return
    protect = getattr(args.opts, "protect", None)
    if not protect:
        yield (
            f"stateful resource of production stack {stack!r} is not protected: "
            "set protect=True (directly or on its component) so `pulumi destroy` cannot delete it"
        )


def check_lb_deletion_protection(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    stack = get(tags_of(props), STACK_TAG)
    if production_stacks(args.get_config())(str(stack)) and not truthy(
        get(props, "enableDeletionProtection")
    ):
        yield f"load balancer of production stack {stack!r} has no deletion protection"


# The AWS Load Balancer Controller's ALB attributes (infra/workloads.py adds deletion protection).
ALB_ATTRIBUTES = "alb.ingress.kubernetes.io/load-balancer-attributes"
WAF_ACL_ANNOTATION = "alb.ingress.kubernetes.io/wafv2-acl-arn"


def check_ingress_deletion_protection(
    props: Mapping[str, Any], args: ResourceValidationArgs
) -> Iterator[str]:
    """An ALB made by the load balancer controller from a production stack's Ingress: its attributes
    annotation (no annotation: an ingress class of the cluster's own, not an ALB) must enable it."""
    stack = stack_of(args.urn)
    attributes = get(props, "metadata", "annotations", ALB_ATTRIBUTES)
    if attributes is None or not production_stacks(args.get_config())(stack):
        return
    pairs = dict(a.strip().partition("=")[::2] for a in str(attributes).split(","))
    if pairs.get("deletion_protection.enabled") != "true":
        yield (
            f"Ingress of production stack {stack!r} makes an ALB without deletion protection: "
            f"add deletion_protection.enabled=true to {ALB_ATTRIBUTES}"
        )


def check_production_ingress_allowlisted(
    props: Mapping[str, Any], args: ResourceValidationArgs
) -> Iterator[str]:
    """The internet-facing ALB a production Ingress makes (the controller's default scheme is
    internal), open to 0.0.0.0/0: the Ingress names a web ACL, as EC2's balancer is associated one."""
    stack = stack_of(args.urn)
    annotations = get(props, "metadata", "annotations", default={}) or {}
    if get(annotations, ALB_ATTRIBUTES) is None or not production_stacks(args.get_config())(stack):
        return
    if get(annotations, SCHEME_ANNOTATION, default="internal") != "internet-facing" or get(
        annotations, WAF_ACL_ANNOTATION
    ):
        return
    cidrs = {
        c.strip() for c in str(get(annotations, INBOUND_CIDRS_ANNOTATION, default="0.0.0.0/0")).split(",")
    }
    if cidrs & {"0.0.0.0/0", "::/0"}:
        yield (
            f"Ingress of production stack {stack!r} makes an internet-facing ALB that admits 0.0.0.0/0 with "
            f"no WAF ({WAF_ACL_ANNOTATION}): set edge.allow_cidrs, edge.scheme: internal, or a WAF "
            "(edge.waf_rate_limit)"
        )


def check_production_targets_https(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    stack = stack_of(args.urn)
    if not production_stacks(args.get_config())(stack):
        return
    # Lambda targets have no protocol; only a plain HTTP hop from the balancer is refused.
    if str(get(props, "protocol", default="")).upper() == "HTTP":
        yield (
            f"target group of production stack {stack!r} forwards plain HTTP to its targets: use HTTPS "
            "(runtime hosts terminate TLS on their own proxy)"
        )
    if str(get(props, "healthCheck", "protocol", default="")).upper() == "HTTP":
        yield f"target group of production stack {stack!r} checks its targets' health over plain HTTP: use HTTPS"


def production_stack_policy(
    name: str,
    description: str,
    check: Callable[[Sequence[PolicyResource], Callable[[str], bool]], Iterable[tuple[PolicyResource, str]]],
) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        for resource, message in check(list(args.resources), production_stacks(args.get_config())):
            report_violation(f"{resource.name}: {message}", resource.urn)

    return StackValidationPolicy(
        name=name,
        description=description,
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=PRODUCTION_SCHEMA,
    )


def _open_group_ids(resources: Sequence[PolicyResource]) -> set[str]:
    """The security groups that take traffic from 0.0.0.0/0 or ::/0, on any port."""
    ids = set()
    for holder, *_ in open_rules(resources, "ingress"):
        group = get(holder.props, "id") if holder.resource_type in SECURITY_GROUP else None
        ids.add(str(group or get(holder.props, "securityGroupId", default="")))
    return ids


def check_production_lb_allowlisted(
    resources: Sequence[PolicyResource], production: Callable[[str], bool]
) -> Iterator[tuple[PolicyResource, str]]:
    """A production balancer open to the internet needs a WAF in front (where a public API's own
    rules live) or an allowlist; a rate limit or an IP set in the WAF is the operator's choice."""
    open_groups = _open_group_ids(resources)
    guarded = {str(get(a.props, "resourceArn")) for a in of_type(resources, WEB_ACL_ASSOCIATION)}
    for lb in of_type(resources, LOAD_BALANCER):
        stack = stack_of(lb.urn)
        if not production(stack) or truthy(get(lb.props, "internal")) or str(get(lb.props, "arn")) in guarded:
            continue
        if any(str(group) in open_groups for group in as_list(get(lb.props, "securityGroups"))):
            yield (
                lb,
                f"internet-facing load balancer of production stack {stack!r} admits 0.0.0.0/0 with no WAF: "
                "set edge.allow_cidrs, edge.scheme: internal, or a WAF (edge.waf_rate_limit)",
            )


def check_production_runtime_egress(
    resources: Sequence[PolicyResource], production: Callable[[str], bool]
) -> Iterator[tuple[PolicyResource, str]]:
    for holder, role, protocol, low, high, public in open_rules(resources, "egress"):
        stack = stack_of(holder.urn)
        if role == RUNTIME_ROLE and production(stack):
            yield (
                holder,
                f"runtime hosts of production stack {stack!r} may send {protocol} {low}-{high} to "
                f"{', '.join(public)}: they reach only the VPC and its endpoints (network.egress: endpoints)",
            )


BUCKET_REPLICATION = ("aws:s3/bucketReplicationConfig:BucketReplicationConfig",)
#: The buckets whose loss loses the stack's past: its deploy history and its gateway's metering.
BACKED_UP_PURPOSES = ("history", "metering")


def _replicates(rule: Mapping[str, Any]) -> bool:
    """An enabled rule that copies into a bucket and leaves deletions behind (infra/backup.py)."""
    return (
        str(get(rule, "status", default="")) == "Enabled"
        and bool(get(rule, "destination", "bucket"))
        and str(get(rule, "deleteMarkerReplication", "status", default="Disabled")) == "Disabled"
    )


def check_production_backup_copy(
    resources: Sequence[PolicyResource], production: Callable[[str], bool]
) -> Iterator[tuple[PolicyResource, str]]:
    """A production stack's history and metering buckets replicate to its backup region, and a
    deletion there never reaches the copy (backup.region in the stack file: infra/backup.py)."""
    replications = of_type(resources, BUCKET_REPLICATION)
    for bucket in of_type(resources, BUCKET):
        stack = stack_of(bucket.urn)
        purpose = str(get(tags_of(bucket.props), PURPOSE_TAG, default=""))
        if purpose not in BACKED_UP_PURPOSES or not production(stack):
            continue
        names = {str(v) for v in (get(bucket.props, "bucket"), get(bucket.props, "id")) if v}
        rules = [
            rule
            for config in replications
            if str(get(config.props, "bucket", default="")) in names
            for rule in as_list(get(config.props, "rules"))
        ]
        if not any(_replicates(rule) for rule in rules):
            yield (
                bucket,
                f"{purpose} bucket of production stack {stack!r} has no backup copy: set backup.region in "
                "the stack file (an enabled replication rule that does not replicate deletions)",
            )


POLICIES = [
    resource_policy(
        "production-stateful-protected",
        "Production buckets, keys, secrets, repositories and clusters are protected from deletion.",
        STATEFUL_MANDATORY + ECR_REPOSITORY,
        check_production_protected,
        config_schema=PRODUCTION_SCHEMA,
    ),
    resource_policy(
        "lb-deletion-protection",
        "Production load balancers are protected from deletion.",
        LOAD_BALANCER,
        check_lb_deletion_protection,
        EnforcementLevel.ADVISORY,
        PRODUCTION_SCHEMA,
    ),
    resource_policy(
        "production-ingress-deletion-protection",
        "The ALB a production stack's Ingress makes is protected from deletion.",
        K8S_INGRESS,
        check_ingress_deletion_protection,
        config_schema=PRODUCTION_SCHEMA,
    ),
    resource_policy(
        "production-ingress-allowlisted",
        "The internet-facing ALB a production Ingress makes is allowlisted or behind a WAF.",
        K8S_INGRESS,
        check_production_ingress_allowlisted,
        config_schema=PRODUCTION_SCHEMA,
    ),
    resource_policy(
        "production-targets-https",
        "Production target groups forward to and check their targets over HTTPS.",
        TARGET_GROUP,
        check_production_targets_https,
        config_schema=PRODUCTION_SCHEMA,
    ),
    production_stack_policy(
        "production-lb-allowlisted",
        "A production load balancer open to 0.0.0.0/0 is internal, allowlisted or behind a WAF.",
        check_production_lb_allowlisted,
    ),
    production_stack_policy(
        "production-backup-copy",
        "Production history and metering buckets replicate to the stack's backup region; deletions do not.",
        check_production_backup_copy,
    ),
    production_stack_policy(
        "production-runtime-egress-to-endpoints",
        "Production runtime hosts send nothing to 0.0.0.0/0 or ::/0, on any port.",
        check_production_runtime_egress,
    ),
]
