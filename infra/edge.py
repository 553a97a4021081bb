"""Edge: the Application Load Balancer in front of the runtime hosts.

HTTPS only (port 80 answers with a permanent redirect), a TLS 1.2+ policy from ``edge.ssl_policy``,
the ACM certificate from ``edge.certificate_arn``. The target group checks ``health.readiness_path``
(readiness drains; liveness is for the host's own supervisor), and drains deregistered targets for
``rollout.deregistration_delay_s`` so ``fab deploy`` never cuts a stream. Optional WAF rate limit.
The HTTPS listener forwards only ``/v1/*`` (a listener rule); everything else gets a fixed 404.

``edge.scheme`` makes it internet-facing (public subnets) or internal (private subnets); who may
connect is its security group's business (:mod:`infra.security_groups`, ``edge.allow_cidrs``).

TLS reaches the hosts too: each runtime host runs HAProxy on :data:`TARGET_TLS_PORT`, rendered from
``templates/haproxy.cfg.j2`` by :func:`render_target_proxy`, which terminates TLS with a certificate
the host makes at first boot (``templates/cloud-init.yaml.j2``) and forwards to the runtime on
loopback. The target group and its health check speak HTTPS to that port.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import pulumi
import pulumi_aws as aws
from frontier_hostside.names import API_PATH_PREFIX, CLOUD_HAPROXY_STATE

from frontier.config.schema import Health, PoolSettings, Settings
from frontier.render.templates import render_template
from frontier.targets.ec2.balancer import FULL_WEIGHT
from infra.storage import LB_LOG_PREFIX
from infra.waf import WebAclArgs, web_acl

# New hosts get a linearly growing share of requests for this long: a fresh runtime has cold CUDA
# graphs and an empty prefix cache. (ALB cannot combine slow start with least-outstanding-requests.)
SLOW_START_S = 60
# The OpenAI-compatible API: the only paths the load balancer forwards.
API_PATH_PATTERNS = (f"{API_PATH_PREFIX}*",)
API_RULE_PRIORITY = 100
NOT_FOUND_BODY = '{"error": {"message": "not found", "type": "not_found"}}'

# The hosts' side of TLS from the load balancer. The ALB does not validate the certificates of its
# targets, "therefore, you can use self-signed certificates or certificates that have expired"
# (Elastic Load Balancing, Application Load Balancers, "Target groups", routing configuration:
# https://docs.aws.amazon.com/elasticloadbalancing/latest/application/load-balancer-target-groups.html),
# so each host makes its own at first boot and no private key ever leaves it.
TARGET_TLS_PORT = 8443
TARGET_TLS_CERTIFICATE = "/etc/frontier/tls/target.pem"  # certificate and key, as HAProxy reads them
# The host tools file cloud-init starts HAProxy with; its absence leaves a host without the proxy.
TARGET_PROXY_FILE = "haproxy-tls.cfg"
# Not admin.sock: the haproxy package's own configuration claims that name in the same directory.
TARGET_PROXY_SOCKET = f"{CLOUD_HAPROXY_STATE}/target-proxy.sock"
PROXY_CHECK_INTERVAL_MS = 1000


def render_target_proxy(
    settings: Settings,
    pool: PoolSettings,
    *,
    certificate: str = TARGET_TLS_CERTIFICATE,
    address: str = "0.0.0.0",
    port: int = TARGET_TLS_PORT,
    stats_socket: str = TARGET_PROXY_SOCKET,
) -> str:
    """A runtime host's HAProxy: TLS on :data:`TARGET_TLS_PORT` in, ``pool``'s runtime on loopback out.

    Its own check of the runtime's readiness path makes it answer 503 while the runtime is not
    ready, which is what the target group's HTTPS health check needs to see. Limits and timeouts
    are the local balancer's for one host (``frontier.targets.local.balancer.render_haproxy``).
    """
    runtime, health = pool.runtime, settings.health
    per_host = runtime.max_concurrency + runtime.queue.max_length
    return render_template(
        "haproxy.cfg.j2",
        stack=settings.stack,
        servers=[("runtime", "127.0.0.1", runtime.port)],
        bind_address=address,
        bind_port=port,
        tls_certificate=certificate,
        stats_socket=stats_socket,
        stats_port=None,
        readiness_path=health.readiness_path,
        # The proxy only mirrors the runtime's readiness, at once; the target group's health
        # check applies the stack's thresholds on top.
        inter_ms=PROXY_CHECK_INTERVAL_MS,
        check_timeout_ms=health.timeout_s * 1000,
        fall=1,
        rise=1,
        queue_timeout_ms=runtime.queue.timeout_ms,
        stream_timeout_s=max(settings.edge.idle_timeout_s, math.ceil(settings.slo.p99_latency_ms / 1000) * 2),
        maxconn=per_host,
        server_maxconn=per_host,
    )


@dataclass(frozen=True)
class TargetProxyFile:
    """:func:`render_target_proxy`'s file for one serving group, and its key: beside the group's host
    tools (under its pool's history), which a booting host copies in one go
    (``templates/cloud-init.yaml.j2``)."""

    group: str
    key: str
    content: str


@dataclass(frozen=True)
class TargetProxyFiles:
    """The serving groups' TLS proxy files, and where they are uploaded."""

    files: Sequence[TargetProxyFile]
    bucket: pulumi.Input[str]
    kms_key_arn: pulumi.Input[str]

    @property
    def keys(self) -> dict[str, str]:
        """Node group -> the object's key."""
        return {f.group: f.key for f in self.files}


@dataclass(frozen=True)
class EdgeArgs:
    stack: str
    vpc_id: pulumi.Input[str]
    # The public subnets for an internet-facing balancer, the private ones for an internal one.
    subnet_ids: Sequence[pulumi.Input[str]]
    security_group_id: pulumi.Input[str]
    # The port the targets serve HTTPS on: HAProxy's TARGET_TLS_PORT on runtime hosts, else the gateway's port.
    target_port: int
    health: Health
    deregistration_delay_s: int
    certificate_arn: str
    ssl_policy: str
    idle_timeout_s: int
    waf_rate_limit: int
    deletion_protection: bool
    logs_bucket: pulumi.Input[str]
    tags: Mapping[str, str]
    internal: bool = False
    target_protocol: Literal["HTTPS", "HTTP"] = "HTTPS"
    # HTTPS: the targets' TLS proxy configuration, uploaded here; the groups wait for it.
    target_proxy: TargetProxyFiles | None = None
    # The WAF's allowlist (edge.allow_cidrs), where the stack has a WAF.
    allow_cidrs: Sequence[str] = ()
    # A rollout by traffic share (rollout.traffic_steps) with the runtimes as targets: a second
    # target group for the new release's hosts, weighed against the first by the API rule.
    canary_group: bool = False


class Edge(pulumi.ComponentResource):
    alb_arn: pulumi.Output[str]
    alb_arn_suffix: pulumi.Output[str]
    alb_dns_name: pulumi.Output[str]
    alb_zone_id: pulumi.Output[str]
    target_group_arn: pulumi.Output[str]
    target_group_arn_suffix: pulumi.Output[str]
    # With EdgeArgs.canary_group: the canary target group and the API rule that weighs the two.
    canary_target_group_arn: pulumi.Output[str] | None
    api_rule_arn: pulumi.Output[str] | None
    web_acl_arn: pulumi.Output[str] | None
    # What a booting host fetches from this component: its node group depends on these.
    target_proxy_objects: list[pulumi.Resource]

    def __init__(self, name: str, args: EdgeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:edge:Edge", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)

        alb = aws.lb.LoadBalancer(
            f"{name}-alb",
            load_balancer_type="application",
            internal=args.internal,
            subnets=list(args.subnet_ids),
            security_groups=[args.security_group_id],
            idle_timeout=args.idle_timeout_s,
            drop_invalid_header_fields=True,
            enable_http2=True,
            enable_deletion_protection=args.deletion_protection,
            access_logs={"bucket": args.logs_bucket, "prefix": LB_LOG_PREFIX, "enabled": True},
            tags=tags,
            opts=child,
        )
        target_group = self._target_group(f"{name}-tg", args, child)
        # The new release's hosts during a rollout by traffic share: the same port and health check.
        canary = self._target_group(f"{name}-canary-tg", args, child) if args.canary_group else None
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
        api_rule = aws.lb.ListenerRule(
            f"{name}-api",
            listener_arn=https.arn,
            priority=API_RULE_PRIORITY,
            conditions=[{"path_pattern": {"values": list(API_PATH_PATTERNS)}}],
            actions=[self._forward(target_group, canary)],
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
        self.target_proxy_objects = self._target_proxy(name, args.target_proxy, dict(args.tags), child)
        self.alb_arn, self.alb_arn_suffix = alb.arn, alb.arn_suffix
        self.alb_dns_name, self.alb_zone_id = alb.dns_name, alb.zone_id
        self.target_group_arn, self.target_group_arn_suffix = target_group.arn, target_group.arn_suffix
        self.canary_target_group_arn = canary.arn if canary is not None else None
        self.api_rule_arn = api_rule.arn if canary is not None else None
        self.register_outputs(
            {
                "alb_dns_name": alb.dns_name,
                "target_group_arn": target_group.arn,
                "web_acl_arn": self.web_acl_arn,
            }
        )

    @staticmethod
    def _target_group(name: str, args: EdgeArgs, child: pulumi.ResourceOptions) -> aws.lb.TargetGroup:
        health = args.health
        return aws.lb.TargetGroup(
            name,
            vpc_id=args.vpc_id,
            target_type="instance",
            port=args.target_port,
            protocol=args.target_protocol,
            protocol_version="HTTP1",
            deregistration_delay=args.deregistration_delay_s,
            slow_start=SLOW_START_S,
            health_check={
                "enabled": True,
                "protocol": args.target_protocol,
                "port": "traffic-port",
                "path": health.readiness_path,
                "interval": health.interval_s,
                "timeout": health.timeout_s,
                "healthy_threshold": health.healthy_threshold,
                "unhealthy_threshold": health.unhealthy_threshold,
                "matcher": "200",
            },
            tags=dict(args.tags),
            opts=child,
        )

    @staticmethod
    def _forward(main: aws.lb.TargetGroup, canary: aws.lb.TargetGroup | None) -> dict[str, object]:
        """The API rule's action: to the main group; with a canary group, weighted, all of it on the
        main group, as a rollout by traffic share leaves it (frontier/targets/ec2/balancer.py,
        FULL_WEIGHT) so ``pulumi up`` between rollouts changes nothing."""
        if canary is None:
            return {"type": "forward", "target_group_arn": main.arn}
        return {
            "type": "forward",
            "forward": {
                "target_groups": [
                    {"arn": main.arn, "weight": FULL_WEIGHT},
                    {"arn": canary.arn, "weight": 0},
                ]
            },
        }

    @staticmethod
    def _target_proxy(
        name: str, files: TargetProxyFiles | None, tags: dict[str, str], child: pulumi.ResourceOptions
    ) -> list[pulumi.Resource]:
        if files is None:
            return []
        return [
            aws.s3.BucketObjectv2(
                f"{name}-target-proxy-{one.group}",
                bucket=files.bucket,
                key=one.key,
                content=one.content,
                server_side_encryption="aws:kms",
                kms_key_id=files.kms_key_arn,
                tags=tags,
                opts=child,
            )
            for one in files.files
        ]

    @staticmethod
    def _waf(
        name: str, args: EdgeArgs, alb: aws.lb.LoadBalancer, child: pulumi.ResourceOptions
    ) -> pulumi.Output[str]:
        """The stack's web ACL (infra/waf.py) in front of its ALB."""
        acl = web_acl(name, WebAclArgs(args.stack, args.waf_rate_limit, args.allow_cidrs, args.tags), child)
        aws.wafv2.WebAclAssociation(f"{name}-waf", resource_arn=alb.arn, web_acl_arn=acl.arn, opts=child)
        return acl.arn
