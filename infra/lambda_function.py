"""A small Python Lambda function of the stack: its log group, its role with one inline policy, and
the function, which waits for both (its first call must find its permissions and its log group).

What invokes it (a schedule, a notice rule, auto scaling's termination policy) and with whose
permission is the caller's concern, beside the function it makes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pulumi
import pulumi_aws as aws

from frontier.identity.cloud import Cloud
from infra.identity import service_role

RUNTIME = "python3.12"


@dataclass(frozen=True)
class FunctionVpc:
    """Where a function runs inside the stack's VPC: subnets (one per zone) and its security groups."""

    subnet_ids: Sequence[pulumi.Input[str]]
    security_group_ids: Sequence[pulumi.Input[str]]


@dataclass(frozen=True)
class PythonFunction:
    cloud: Cloud
    function_name: str
    description: str
    # What the role is for, in the role's own description.
    role_description: str
    # ``module.function`` inside the archive.
    handler: str
    # The archive: path inside it → file here.
    files: Mapping[str, Path]
    timeout_s: int
    # The role's inline policy, given the function's log group ARN.
    policy: Callable[[pulumi.Output[str]], pulumi.Input[str]]
    tags: Mapping[str, str]
    log_retention_days: int
    environment: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)
    # Encrypts the log group where set (a function whose logs may carry what the stack keeps secret).
    log_kms_key_arn: pulumi.Input[str] | None = None
    # Inside the VPC where set (its policy must then hold :func:`reach_its_vpc`); else AWS's network.
    vpc: FunctionVpc | None = None


def python_function(name: str, spec: PythonFunction, parent: pulumi.Resource) -> aws.lambda_.Function:
    """The function and what it needs before its first call, children of ``parent``."""
    child = pulumi.ResourceOptions(parent=parent)
    tags = dict(spec.tags)
    logs = aws.cloudwatch.LogGroup(
        f"{name}-logs",
        name=f"/aws/lambda/{spec.function_name}",
        retention_in_days=spec.log_retention_days,
        kms_key_id=spec.log_kms_key_arn,
        tags=tags,
        opts=child,
    )
    role = service_role(f"{name}-role", "lambda", spec.role_description, spec.cloud, tags, parent)
    access = aws.iam.RolePolicy(f"{name}-role", role=role.id, policy=spec.policy(logs.arn), opts=child)
    return aws.lambda_.Function(
        f"{name}-function",
        name=spec.function_name,
        description=spec.description,
        runtime=RUNTIME,
        handler=spec.handler,
        role=role.arn,
        timeout=spec.timeout_s,
        memory_size=128,
        code=pulumi.AssetArchive(
            {path: pulumi.FileAsset(str(source)) for path, source in spec.files.items()}
        ),
        environment={"variables": dict(spec.environment)},
        vpc_config=None
        if spec.vpc is None
        else {
            "subnet_ids": list(spec.vpc.subnet_ids),
            "security_group_ids": list(spec.vpc.security_group_ids),
        },
        tags=tags,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[access, logs]),
    )


def reach_its_vpc() -> dict[str, object]:
    """The statement a function in a VPC needs: Lambda attaches it through network interfaces it
    makes, describes and removes with the function's role. Resource "*" as AWS's own
    AWSLambdaVPCAccessExecutionRole has it: Lambda checks these actions when the function is made,
    and a role scoped by resource or condition fails that check."""
    return {
        "Sid": "ReachItsVpc",
        "Effect": "Allow",
        "Action": [
            "ec2:CreateNetworkInterface",
            "ec2:DescribeNetworkInterfaces",
            "ec2:DeleteNetworkInterface",
            "ec2:AssignPrivateIpAddresses",
            "ec2:UnassignPrivateIpAddresses",
        ],
        "Resource": "*",
    }


def write_its_logs(log_group_arn: str) -> dict[str, object]:
    """The statement every function's policy ends with: it writes its own log group, nothing else."""
    return {
        "Sid": "WriteItsLogs",
        "Effect": "Allow",
        "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
        "Resource": f"{log_group_arn}:*",
    }


def invoked_by_rule(
    function: aws.lambda_.Function,
    rule: aws.cloudwatch.EventRule,
    names: tuple[str, str],
    cloud: Cloud,
    parent: pulumi.Resource,
) -> aws.cloudwatch.EventTarget:
    """``rule`` invokes ``function``, and only that rule may; ``names`` are the permission's and the
    target's. The target waits for the permission: an event sent before it would be refused and lost."""
    permission_name, target_name = names
    invoke = aws.lambda_.Permission(
        permission_name,
        action="lambda:InvokeFunction",
        function=function.name,
        principal=cloud.service_principal("events"),
        source_arn=rule.arn,
        opts=pulumi.ResourceOptions(parent=parent),
    )
    return aws.cloudwatch.EventTarget(
        target_name,
        rule=rule.name,
        arn=function.arn,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[invoke]),
    )
