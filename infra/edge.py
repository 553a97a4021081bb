"""Edge: the public Application Load Balancer in front of the runtime hosts.

HTTPS only (port 80 answers with a permanent redirect), a TLS 1.2+ policy from ``edge.ssl_policy``,
the ACM certificate from ``edge.certificate_arn``. The target group checks ``health.readiness_path``
(readiness drains; liveness is for the host's own supervisor), and drains deregistered targets for
``rollout.deregistration_delay_s`` so ``fab deploy`` never cuts a stream. Optional WAF rate limit.
The HTTPS listener forwards only ``/v1/*`` (a listener rule); everything else gets a fixed 404.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
from frontier_hostside.names import API_PATH_PREFIX

from frontier.config.schema import Health
from infra.storage import LB_LOG_PREFIX

# New hosts get a linearly growing share of requests for this long: a fresh runtime has cold CUDA
# graphs and an empty prefix cache. (ALB cannot combine slow start with least-outstanding-requests.)
SLOW_START_S = 60
# The OpenAI-compatible API: the only paths the load balancer forwards.
API_PATH_PATTERNS = (f"{API_PATH_PREFIX}*",)
API_RULE_PRIORITY = 100
NOT_FOUND_BODY = '{"error": {"message": "not found", "type": "not_found"}}'


@dataclass(frozen=True)
class EdgeArgs:
    stack: str
    vpc_id: pulumi.Input[str]
    public_subnet_ids: Sequence[pulumi.Input[str]]
    security_group_id: pulumi.Input[str]
    runtime_port: int
    health: Health
    deregistration_delay_s: int
    certificate_arn: str
    ssl_policy: str
    idle_timeout_s: int
    waf_rate_limit: int
    deletion_protection: bool
    logs_bucket: pulumi.Input[str]
    tags: Mapping[str, str]


class Edge(pulumi.ComponentResource):
    alb_arn: pulumi.Output[str]
    alb_arn_suffix: pulumi.Output[str]
    alb_dns_name: pulumi.Output[str]
    alb_zone_id: pulumi.Output[str]
    target_group_arn: pulumi.Output[str]
    target_group_arn_suffix: pulumi.Output[str]
    web_acl_arn: pulumi.Output[str] | None

    def __init__(self, name: str, args: EdgeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:edge:Edge", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags, health = dict(args.tags), args.health

        alb = aws.lb.LoadBalancer(
            f"{name}-alb",
            load_balancer_type="application",
            internal=False,
            subnets=list(args.public_subnet_ids),
            security_groups=[args.security_group_id],
            idle_timeout=args.idle_timeout_s,
            drop_invalid_header_fields=True,
            enable_http2=True,
            enable_deletion_protection=args.deletion_protection,
            access_logs={"bucket": args.logs_bucket, "prefix": LB_LOG_PREFIX, "enabled": True},
            tags=tags,
            opts=child,
        )
        target_group = aws.lb.TargetGroup(
            f"{name}-tg",
            vpc_id=args.vpc_id,
            target_type="instance",
            port=args.runtime_port,
            protocol="HTTP",
            protocol_version="HTTP1",
            deregistration_delay=args.deregistration_delay_s,
            slow_start=SLOW_START_S,
            health_check={
                "enabled": True,
                "protocol": "HTTP",
                "port": "traffic-port",
                "path": health.readiness_path,
                "interval": health.interval_s,
                "timeout": health.timeout_s,
                "healthy_threshold": health.healthy_threshold,
                "unhealthy_threshold": health.unhealthy_threshold,
                "matcher": "200",
            },
            tags=tags,
            opts=child,
        )
        https = aws.lb.Listener(
            f"{name}-https",
            load_balancer_arn=alb.arn,
            port=443,
            protocol="HTTPS",
            ssl_policy=args.ssl_policy,
            certificate_arn=args.certificate_arn,
            # Only the API is public: /metrics and /health/* answer the target group's checks and
            # the host itself, never the internet. Anything the rule below does not match is a 404.
            default_actions=[
                {
                    "type": "fixed-response",
                    "fixed_response": {
                        "content_type": "application/json",
                        "message_body": NOT_FOUND_BODY,
                        "status_code": "404",
                    },
                }
            ],
            tags=tags,
            opts=child,
        )
        aws.lb.ListenerRule(
            f"{name}-api",
            listener_arn=https.arn,
            priority=API_RULE_PRIORITY,
            conditions=[{"path_pattern": {"values": list(API_PATH_PATTERNS)}}],
            actions=[{"type": "forward", "target_group_arn": target_group.arn}],
            tags=tags,
            opts=child,
        )
        aws.lb.Listener(
            f"{name}-http",
            load_balancer_arn=alb.arn,
            port=80,
            protocol="HTTP",
            default_actions=[
                {
                    "type": "redirect",
                    "redirect": {"protocol": "HTTPS", "port": "443", "status_code": "HTTP_301"},
                }
            ],
            tags=tags,
            opts=child,
        )

        self.web_acl_arn = self._waf(name, args, alb, child) if args.waf_rate_limit > 0 else None
        self.alb_arn, self.alb_arn_suffix = alb.arn, alb.arn_suffix
        self.alb_dns_name, self.alb_zone_id = alb.dns_name, alb.zone_id
        self.target_group_arn, self.target_group_arn_suffix = target_group.arn, target_group.arn_suffix
        self.register_outputs(
            {
                "alb_dns_name": alb.dns_name,
                "target_group_arn": target_group.arn,
                "web_acl_arn": self.web_acl_arn,
            }
        )

    @staticmethod
    def _waf(
        name: str, args: EdgeArgs, alb: aws.lb.LoadBalancer, child: pulumi.ResourceOptions
    ) -> pulumi.Output[str]:
        """Blocks a client IP that sends more than ``edge.waf_rate_limit`` requests in 5 minutes."""
        metric = f"frontier-{args.stack}"
        acl = aws.wafv2.WebAcl(
            f"{name}-waf",
            scope="REGIONAL",
            description=f"Frontier {args.stack}: per-client rate limit",
            default_action={"allow": {}},
            rules=[
                {
                    "name": "rate-limit-per-client-ip",
                    "priority": 0,
                    "action": {"block": {}},
                    "statement": {
                        "rate_based_statement": {
                            "limit": args.waf_rate_limit,
                            "aggregate_key_type": "IP",
                            "evaluation_window_sec": 300,
                        }
                    },
                    "visibility_config": {
                        "cloudwatch_metrics_enabled": True,
                        "metric_name": f"{metric}-rate-limit",
                        "sampled_requests_enabled": True,
                    },
                }
            ],
            visibility_config={
                "cloudwatch_metrics_enabled": True,
                "metric_name": metric,
                "sampled_requests_enabled": True,
            },
            tags=dict(args.tags),
            opts=child,
        )
        aws.wafv2.WebAclAssociation(f"{name}-waf", resource_arn=alb.arn, web_acl_arn=acl.arn, opts=child)
        return acl.arn
