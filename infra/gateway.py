"""The gateway's own small CPU node group behind the ALB; the runtimes behind it become private.

- The ALB forwards to the gateway's port only; the gateway's group registers in the ALB's target
  group, whose health check probes the gateway's readiness (ready while every model has a ready
  replica).
- Runtime hosts take their port from the gateway's security group only.
- The gateway's role reads its tenants' key digests and the runtimes' key (Secrets Manager, KMS),
  lists instances (it finds each pool's runtimes by their tags) and writes metering records under
  its S3 prefix; nothing else.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
from frontier_hostside.names import ROLE_TAG

from infra.tags import with_tags

GATEWAY_ROLE = "gateway"


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
    runtime_port: int
    instance_type: str
    ami_id: str
    min_size: int
    desired_size: int
    max_size: int
    secret_names: Sequence[str]  # tenants' digests and the runtimes' key
    kms_key_arn: pulumi.Input[str]
    metering_bucket: str
    metering_prefix: str
    user_data: str
    tags: Mapping[str, str]


class GatewayNodes(pulumi.ComponentResource):
    security_group_id: pulumi.Output[str]
    asg_name: pulumi.Output[str]
    role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: GatewayNodesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:gateway:GatewayNodes", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = with_tags(dict(args.tags), role=GATEWAY_ROLE)

        group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            description=f"Gateway: port {args.port} from the load balancer only",
            vpc_id=args.vpc_id,
            tags=tags,
            opts=child,
        )
        rule = aws.vpc.SecurityGroupIngressRule
        rule(
            f"{name}-from-alb",
            security_group_id=group.id,
            referenced_security_group_id=args.alb_security_group_id,
            ip_protocol="tcp",
            from_port=args.port,
            to_port=args.port,
            description="Requests from the ALB",
            opts=child,
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-alb-to-gateway",
            security_group_id=args.alb_security_group_id,
            referenced_security_group_id=group.id,
            ip_protocol="tcp",
            from_port=args.port,
            to_port=args.port,
            description="Forward to the gateway",
            opts=child,
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-to-runtime",
            security_group_id=group.id,
            referenced_security_group_id=args.runtime_security_group_id,
            ip_protocol="tcp",
            from_port=args.runtime_port,
            to_port=args.runtime_port,
            description="Forward to the runtimes",
            opts=child,
        )
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
        rule(
            f"{name}-runtime-from-gateway",
            security_group_id=args.runtime_security_group_id,
            referenced_security_group_id=group.id,
            ip_protocol="tcp",
            from_port=args.runtime_port,
            to_port=args.runtime_port,
            description="Requests from the gateway",
            opts=child,
        )

        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "ec2.amazonaws.com"},
                            "Action": "sts:AssumeRole",
                        }
                    ],
                }
            ),
            tags=tags,
            opts=child,
        )
        secret_arns = [
            f"arn:aws:secretsmanager:{args.region}:{args.account_id}:secret:{secret}-*"
            for secret in args.secret_names
        ]
        metering_arn = f"arn:aws:s3:::{args.metering_bucket}/{args.metering_prefix.strip('/')}/*"
        grants = aws.iam.RolePolicy(
            f"{name}-policy",
            role=role.id,
            policy=pulumi.Output.from_input(args.kms_key_arn).apply(
                lambda key: json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [
                            {
                                "Sid": "ReadKeyDigests",
                                "Effect": "Allow",
                                "Action": "secretsmanager:GetSecretValue",
                                "Resource": secret_arns,
                            },
                            {
                                "Sid": "DecryptSecrets",
                                "Effect": "Allow",
                                "Action": "kms:Decrypt",
                                "Resource": key,
                            },
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
                        ],
                    }
                )
            ),
            opts=child,
        )
        ssm = aws.iam.RolePolicyAttachment(
            f"{name}-ssm",
            role=role.name,
            policy_arn="arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
            opts=child,
        )
        profile = aws.iam.InstanceProfile(f"{name}-profile", role=role.name, tags=tags, opts=child)

        host_tags = {**tags, ROLE_TAG: GATEWAY_ROLE, "Name": f"frontier-{args.stack}-gateway"}
        template = aws.ec2.LaunchTemplate(
            f"{name}-lt",
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
                {"resource_type": kind, "tags": host_tags} for kind in ("instance", "volume")
            ],
            update_default_version=True,
            tags=tags,
            opts=child,
        )
        asg = aws.autoscaling.Group(
            f"{name}-asg",
            min_size=args.min_size,
            desired_capacity=args.desired_size,
            max_size=args.max_size,
            vpc_zone_identifiers=list(args.subnet_ids),
            launch_template={"id": template.id, "version": template.latest_version.apply(str)},
            target_group_arns=[args.target_group_arn],
            health_check_type="ELB",
            health_check_grace_period=300,
            instance_refresh={"strategy": "Rolling", "preferences": {"min_healthy_percentage": 50}},
            tags=[{"key": k, "value": v, "propagate_at_launch": True} for k, v in host_tags.items()],
            # The profile names the role at once, its policies only once attached: hosts must not boot first.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[grants, ssm]),
        )
        self.security_group_id = group.id
        self.asg_name = asg.name
        self.role_arn = role.arn
        self.register_outputs({"security_group_id": group.id, "asg_name": asg.name})
