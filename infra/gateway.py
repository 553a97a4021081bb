"""The gateway's own small CPU node group behind the ALB; the runtimes behind it become private.

- The ALB forwards to the gateway's port only, over HTTPS: the gateway terminates TLS itself
  (uvicorn, with a certificate each host makes at first boot; templates/gateway-cloud-init.yaml.j2).
  The gateway's group registers in the ALB's target group, whose HTTPS health check probes the
  gateway's readiness (ready while every model has a ready replica).
- Rolled without dropping capacity: the user data names the digest of the stack's gateway.yaml,
  so a changed gateway config is a new launch template version, and the group's instance refresh
  (minimum healthy 100 %, maximum 200 %, ELB health checks; the preferences of
  :data:`frontier.targets.ec2.gateway.GATEWAY_REFRESH`) launches each replacement, waits for it to
  pass the target group's health check and warm up, and only then drains and terminates an old
  host. ``fab gateway.roll`` starts the same refresh after ``fab gateway.publish`` and waits.
  (An instance refresh rather than the runtimes' host-by-host roll: gateway hosts hold no release
  state to verify, so AWS's own replacement is the whole job.)
- Runtime hosts take their port from the gateway's security group only, and so do the KV-event
  ports (publish and replay) of a pool with ``runtime.kv_events`` on: the gateway alone subscribes.
- Its hosts install nothing at boot, whatever ``network.egress`` says: ``gateway.ami_id`` must pin an
  image baked for them (``fab ami.bake --group gateway``), whose ``frontier:host-tools`` tag names
  what they run (:func:`frontier.render.boot.gateway_tools`); another image is refused before
  anything is created (:func:`gateway_image_problems`), as a host on it would stop at its preflight.
- The gateway's role reads its tenants' key digests and the runtimes' key (Secrets Manager, KMS),
  lists instances (it finds each pool's runtimes by their tags), reads what it boots from under the
  history prefix's ``gateway/``, reads the two tokenizer files of each pool it routes by KV events
  (:mod:`frontier.identity.gateway`), writes metering records under its S3 prefix, ships its logs to its
  stack's log groups and puts metrics in the runtime's CloudWatch namespace (the held requests the
  from-zero alarms read; infra/monitoring.py alarms on the rest); nothing else.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
from frontier_hostside.names import CLOUDWATCH_NAMESPACE, ROLE_TAG

from frontier.config import host_image
from frontier.config.schema import Settings
from frontier.identity.documents import trust
from frontier.identity.gateway import secret_statements, tokenizer_statements
from frontier.render.boot import gateway_bake_command, gateway_tools
from frontier.targets.ec2.gateway import GATEWAY_REFRESH, GATEWAY_ROLE
from infra.component import Component
from infra.doors import Rule, open_door
from infra.nodes import CANONICAL, MachineImage, look_up_ami
from infra.tags import with_tags


def look_up_gateway_image(settings: Settings) -> MachineImage | None:
    """The image ``gateway.ami_id`` pins (None: no gateway, or none pinned, which the preflight names)."""
    gw = settings.gateway
    if gw is None or not gw.ami_id:
        return None
    bake = f"bake one with `{gateway_bake_command(settings)}`"
    # The account's own (what the bake makes) and Canonical's: a gateway host never boots a GPU image.
    return look_up_ami(gw.ami_id, "gateway", gw.instance_type, bake, owners=("self", CANONICAL))


def gateway_image_problems(settings: Settings, image: MachineImage | None) -> Iterator[str]:
    """A gateway image that does not carry (by its tag) what its hosts run, or none pinned."""
    if settings.gateway is None:
        return
    bake = f"bake one with `{gateway_bake_command(settings)}` and pin it here"
    if image is None:
        yield f"gateway.ami_id is empty: gateway hosts install nothing at boot: {bake}"
        return
    missing = host_image.missing_from(image.host_tools, gateway_tools())
    if missing:
        carried = "a stock image (no frontier:host-tools tag)" if image.host_tools is None else "an image"
        yield (
            f"gateway.ami_id = {image.image_id!r}: {carried} without {', '.join(missing)}; gateway hosts "
            f"install nothing at boot: {bake}"
        )


@dataclass(frozen=True)
class GatewayNodesArgs:
    stack: str
    region: str
    account_id: str
    vpc_id: pulumi.Input[str]
    subnet_ids: Sequence[pulumi.Input[str]]
    alb_security_group_id: pulumi.Input[str]
    runtime_security_group_id: pulumi.Input[str]
    target_group_arn: pulumi.Input[str]
    port: int
    # Every pool's runtime port: the gateway forwards to each.
    runtime_ports: Sequence[int]
    instance_type: str
    ami_id: str
    min_size: int
    desired_size: int
    max_size: int
    secret_names: Sequence[str]  # tenants' digests and every pool's runtime keys
    kms_key_arn: pulumi.Input[str]
    metering_bucket: str
    metering_prefix: str
    user_data: str
    tags: Mapping[str, str]
    # What hosts boot from: ``<history_prefix>gateway/`` of this bucket (`fab gateway.publish`).
    history_bucket: str = ""
    history_prefix: str = ""
    # How long a host may take from launch to passing the target group's health check.
    health_check_grace_s: int = 300
    # network.egress: "endpoints" keeps HTTPS inside the VPC (its endpoints and S3's prefix list,
    # infra.security_groups); only "internet" opens 443 to anywhere, through the NAT.
    egress: str = "endpoints"
    # The KV-event ports (publish and replay) of the pools whose runtimes publish their prefix
    # cache's changes (``runtime.kv_events``): the gateway subscribes to each runtime there.
    kv_event_ports: Sequence[int] = ()
    # The tokenizer objects of the pools it routes by KV events (frontier.identity.gateway): read
    # once at start, the only objects of the weights it may read.
    tokenizer_arns: Sequence[str] = ()
    # What must exist before a host boots, made from the gateway's security group once it exists
    # (the quota store admits that group, and hosts read its URL at start): no host boots into a
    # restart loop waiting for it on a first ``pulumi up``.
    boot_dependencies: Callable[[pulumi.Output[str]], Sequence[pulumi.Resource]] | None = None


class GatewayNodes(Component[GatewayNodesArgs]):
    security_group_id: pulumi.Output[str]
    asg_name: pulumi.Output[str]
    role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: GatewayNodesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:gateway:GatewayNodes", name, args, opts)
        self._tags = with_tags(dict(args.tags), role=GATEWAY_ROLE)

        group = self._security_group()
        # Made from the group, so only once it exists (the quota store admits it).
        boot_after = list(args.boot_dependencies(group.id)) if args.boot_dependencies else []
        role, grants = self._role()
        profile = aws.iam.InstanceProfile(
            f"{name}-profile", role=role.name, tags=self._tags, opts=self._child
        )
        template = self._launch_template(group, profile)
        # The profile names the role at once, its policies only once attached: hosts must not boot first.
        asg = self._auto_scaling_group(template, after=[*grants, *boot_after])

        self.security_group_id = group.id
        self.asg_name = asg.name
        self.role_arn = role.arn
        self.register_outputs({"security_group_id": group.id, "asg_name": asg.name})

    def _security_group(self) -> aws.ec2.SecurityGroup:
        """The gateway's group: its port from the ALB in; every pool's runtime port out, which the
        runtime hosts take from this group only, and likewise the KV-event ports of the pools that
        publish them (and, with internet egress, AWS's APIs out)."""
        name, args, child = self._name, self._args, self._child
        group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            description=f"Gateway: port {args.port} from the load balancer only",
            vpc_id=args.vpc_id,
            tags=self._tags,
            opts=child,
        )
        open_door(
            args.port,
            source=args.alb_security_group_id,
            target=group.id,
            ingress=Rule(f"{name}-from-alb", "Requests from the ALB"),
            egress=Rule(f"{name}-alb-to-gateway", "Forward to the gateway"),
            opts=child,
        )

        def to_runtimes(port: int, ingress: Rule, egress: Rule) -> None:
            open_door(
                port,
                source=group.id,
                target=args.runtime_security_group_id,
                ingress=ingress,
                egress=egress,
                opts=child,
            )

        for index, port in enumerate(sorted(set(args.runtime_ports))):
            # The first port keeps its rules' original names, so a one-port stack's rules are not replaced.
            suffix = f"-{port}" if index else ""
            to_runtimes(
                port,
                Rule(f"{name}-runtime-from-gateway{suffix}", "Requests from the gateway"),
                Rule(f"{name}-to-runtime{suffix}", "Forward to the runtimes"),
            )
        for port in sorted(set(args.kv_event_ports)):
            # Only the gateway subscribes to the runtimes' KV events and asks for their replays.
            to_runtimes(
                port,
                Rule(f"{name}-runtime-kv-events-{port}-from-gateway", "KV events to the gateway"),
                Rule(f"{name}-to-runtime-kv-events-{port}", "Subscribe to the runtimes' KV events"),
            )
        if args.egress == "internet":
            aws.vpc.SecurityGroupEgressRule(
                f"{name}-to-aws-apis",
                security_group_id=group.id,
                cidr_ipv4="0.0.0.0/0",
                ip_protocol="tcp",
                from_port=443,
                to_port=443,
                description="Secrets Manager, S3 and KMS over HTTPS (through the NAT)",
                opts=child,
            )
        return group

    def _role(self) -> tuple[aws.iam.Role, list[pulumi.Resource]]:
        """The hosts' role and the grants a host needs before it boots (its policy, SSM's)."""
        name, args, child = self._name, self._args, self._child
        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=trust({"Service": "ec2.amazonaws.com"}),
            tags=self._tags,
            opts=child,
        )
        grants = aws.iam.RolePolicy(
            f"{name}-policy",
            role=role.id,
            policy=pulumi.Output.from_input(args.kms_key_arn).apply(
                lambda key: json.dumps(gateway_host_policy(args, key))
            ),
            opts=child,
        )
        ssm = aws.iam.RolePolicyAttachment(
            f"{name}-ssm",
            role=role.name,
            policy_arn="arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
            opts=child,
        )
        return role, [grants, ssm]

    def _launch_template(
        self, group: aws.ec2.SecurityGroup, profile: aws.iam.InstanceProfile
    ) -> aws.ec2.LaunchTemplate:
        args = self._args
        return aws.ec2.LaunchTemplate(
            f"{self._name}-lt",
            description=f"Frontier {args.stack}: gateway ({args.instance_type})",
            image_id=args.ami_id,
            instance_type=args.instance_type,
            iam_instance_profile={"arn": profile.arn},
            metadata_options={
                "http_endpoint": "enabled",
                "http_tokens": "required",
                "http_put_response_hop_limit": 1,
            },
            network_interfaces=[
                {
                    "device_index": 0,
                    "associate_public_ip_address": "false",
                    "delete_on_termination": "true",
                    "security_groups": [group.id],
                }
            ],
            user_data=base64.b64encode(args.user_data.encode()).decode(),
            tag_specifications=[
                {"resource_type": kind, "tags": self._host_tags()} for kind in ("instance", "volume")
            ],
            update_default_version=True,
            tags=self._tags,
            opts=self._child,
        )

    def _auto_scaling_group(
        self, template: aws.ec2.LaunchTemplate, after: Sequence[pulumi.Resource]
    ) -> aws.autoscaling.Group:
        """The group in the ALB's target group, rolled by instance refresh; made after ``after``."""
        args = self._args
        return aws.autoscaling.Group(
            f"{self._name}-asg",
            min_size=args.min_size,
            desired_capacity=args.desired_size,
            max_size=args.max_size,
            vpc_zone_identifiers=list(args.subnet_ids),
            launch_template={"id": template.id, "version": template.latest_version.apply(str)},
            target_group_arns=[args.target_group_arn],
            health_check_type="ELB",
            health_check_grace_period=args.health_check_grace_s,
            # A new launch template version (a changed gateway config, AMI or instance type) rolls
            # the group: each replacement first, healthy in the target group, then an old host goes.
            instance_refresh={
                "strategy": "Rolling",
                "preferences": {
                    "min_healthy_percentage": GATEWAY_REFRESH.min_healthy_percentage,
                    "max_healthy_percentage": GATEWAY_REFRESH.max_healthy_percentage,
                    "instance_warmup": str(GATEWAY_REFRESH.instance_warmup_s),
                    "skip_matching": True,
                },
            },
            tags=[{"key": k, "value": v, "propagate_at_launch": True} for k, v in self._host_tags().items()],
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(after)),
        )

    def _host_tags(self) -> dict[str, str]:
        """What each host and its volumes carry: the discovery tags and a readable name."""
        return {**self._tags, ROLE_TAG: GATEWAY_ROLE, "Name": f"frontier-{self._args.stack}-gateway"}


def gateway_host_policy(args: GatewayNodesArgs, kms_key_arn: str) -> dict[str, Any]:
    """What a gateway host does with AWS; nothing else."""
    secret_arns = [
        f"arn:aws:secretsmanager:{args.region}:{args.account_id}:secret:{secret}-*"
        for secret in args.secret_names
    ]
    metering_arn = f"arn:aws:s3:::{args.metering_bucket}/{args.metering_prefix.strip('/')}/*"
    release_prefix = f"{args.history_prefix.rstrip('/')}/gateway/".lstrip("/")
    release_arn = f"arn:aws:s3:::{args.history_bucket}/{release_prefix.rstrip('/')}"
    # /frontier/<stack>/gateway and /frontier/<stack>/cloud-init (infra/monitoring.py).
    log_groups = f"arn:aws:logs:{args.region}:{args.account_id}:log-group:/frontier/{args.stack}/*"
    return {
        "Version": "2012-10-17",
        "Statement": [
            *secret_statements(secret_arns, kms_key_arn),
            {
                # Replicas are found by their tags; DescribeInstances has no
                # resource-level permissions.
                "Sid": "DiscoverRuntimes",
                "Effect": "Allow",
                "Action": "ec2:DescribeInstances",
                "Resource": "*",
            },
            {
                "Sid": "WriteMetering",
                "Effect": "Allow",
                "Action": "s3:PutObject",
                "Resource": metering_arn,
            },
            {
                # The stack's buckets encrypt with its key (SSE-KMS): S3 asks KMS for a new object's
                # data key with the writer's permissions, so without this every flush is refused.
                "Sid": "EncryptMetering",
                "Effect": "Allow",
                "Action": "kms:GenerateDataKey",
                "Resource": kms_key_arn,
                "Condition": {"StringEquals": {"kms:ViaService": f"s3.{args.region}.amazonaws.com"}},
            },
            *tokenizer_statements(list(args.tokenizer_arns)),
            {
                "Sid": "ReadWhatItBoots",
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": f"{release_arn}/*",
            },
            {
                "Sid": "ListWhatItBoots",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{args.history_bucket}",
                "Condition": {"StringLike": {"s3:prefix": f"{release_prefix}*"}},
            },
            {
                "Sid": "ShipItsLogs",
                "Effect": "Allow",
                "Action": [
                    "logs:CreateLogStream",
                    "logs:PutLogEvents",
                    "logs:DescribeLogStreams",
                ],
                "Resource": [
                    f"{log_groups}:*",
                    f"{log_groups}:log-stream:*",
                ],
            },
            {
                # The held requests (the from-zero alarms' signal), its answers, and
                # the CloudWatch agent's host metrics: the runtime's namespace only.
                "Sid": "PutGatewayMetrics",
                "Effect": "Allow",
                "Action": "cloudwatch:PutMetricData",
                "Resource": "*",
                "Condition": {"StringEquals": {"cloudwatch:namespace": CLOUDWATCH_NAMESPACE}},
            },
        ],
    }
