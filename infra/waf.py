"""The stack's web ACL: a per-client rate limit and, with an allowlist, nothing else let in.

EC2's ALB is the program's own and is associated here; on EKS the load balancer controller makes the
ALB from the Ingress and associates the ACL the Ingress names (``alb.ingress.kubernetes.io/wafv2-acl-arn``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

# AWS WAF's rate-based rules count over a window of this many seconds.
RATE_WINDOW_S = 300


@dataclass(frozen=True)
class WebAclArgs:
    stack: str
    # Requests one client IP may send per window (edge.waf_rate_limit).
    rate_limit: int
    # edge.allow_cidrs: when set, every other client is blocked (and counted, where the security
    # group would drop it silently).
    allow_cidrs: Sequence[str]
    tags: Mapping[str, str]


def web_acl(name: str, args: WebAclArgs, opts: pulumi.ResourceOptions) -> aws.wafv2.WebAcl:
    metric = f"frontier-{args.stack}"
    rules: list[dict] = [
        {
            "name": "rate-limit-per-client-ip",
            "priority": 0,
            "action": {"block": {}},
            "statement": {
                "rate_based_statement": {
                    "limit": args.rate_limit,
                    "aggregate_key_type": "IP",
                    "evaluation_window_sec": RATE_WINDOW_S,
                }
            },
            "visibility_config": {
                "cloudwatch_metrics_enabled": True,
                "metric_name": f"{metric}-rate-limit",
                "sampled_requests_enabled": True,
            },
        }
    ]
    default_action: dict = {"allow": {}}
    if args.allow_cidrs:
        allowed = aws.wafv2.IpSet(
            f"{name}-allowed",
            scope="REGIONAL",
            ip_address_version="IPV4",
            addresses=list(args.allow_cidrs),
            description=f"Frontier {args.stack}: edge.allow_cidrs",
            tags=dict(args.tags),
            opts=opts,
        )
        rules.append(
            {
                "name": "allow-listed-clients",
                "priority": 1,
                "action": {"allow": {}},
                "statement": {"ip_set_reference_statement": {"arn": allowed.arn}},
                "visibility_config": {
                    "cloudwatch_metrics_enabled": True,
                    "metric_name": f"{metric}-allowed",
                    "sampled_requests_enabled": True,
                },
            }
        )
        default_action = {"block": {}}
    return aws.wafv2.WebAcl(
        f"{name}-waf",
        scope="REGIONAL",
        description=f"Frontier {args.stack}: per-client rate limit",
        default_action=default_action,
        rules=rules,
        visibility_config={
            "cloudwatch_metrics_enabled": True,
            "metric_name": metric,
            "sampled_requests_enabled": True,
        },
        tags=dict(args.tags),
        opts=opts,
    )


class StackWebAcl(pulumi.ComponentResource):
    """The web ACL of a stack whose ALB another party makes (EKS: the load balancer controller)."""

    arn: pulumi.Output[str]

    def __init__(self, name: str, args: WebAclArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:edge:WebAcl", name, None, opts)
        self.arn = web_acl(name, args, pulumi.ResourceOptions(parent=self)).arn
        self.register_outputs({"arn": self.arn})
