"""A spot host out of the load balancer within seconds of its two-minute warning.

Where the ALB fronts the runtimes (no gateway) and a serving group buys spot, an EventBridge rule
of the spot warnings invokes a Lambda function (``infra/functions/out_of_service.py``) that
deregisters the warned instance from the stack's target groups: the ALB stops sending it new
requests then, where its health checks would have taken two failed intervals (≥ 10 s). Behind a
gateway the ALB's targets are the gateway's hosts, and the host's agent tells the gateway itself
(frontier_hostside.interruption), so no function is made.

A function, not the host: a host allowed to deregister targets could take every other host out of
its group too. The function's role may describe target health (IAM cannot scope that call) and
deregister targets from this stack's groups only; only its rule may invoke it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws

from frontier.config.purchase import SpotCapacity
from frontier.config.schema import Settings
from frontier.identity.cloud import Cloud
from infra.functions import out_of_service
from infra.lambda_function import PythonFunction, invoked_by_rule, python_function, write_its_logs

FUNCTION_FILES = {"out_of_service.py": Path(out_of_service.__file__)}
# Two ELB calls per target group; room for a slow API.
TIMEOUT_S = 30


def function_name(stack: str) -> str:
    return f"frontier-{stack}-out-of-service"


def warning_pattern() -> dict[str, object]:
    return {"source": ["aws.ec2"], "detail-type": [out_of_service.SPOT_WARNING]}


def out_of_service_policy(target_group_arns: Sequence[str], log_group_arn: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "SeeWhoTheGroupsHold",
                    "Effect": "Allow",
                    "Action": "elasticloadbalancing:DescribeTargetHealth",
                    "Resource": "*",  # Describe calls cannot be scoped to a resource in IAM
                },
                {
                    "Sid": "TakeAWarnedHostOut",
                    "Effect": "Allow",
                    "Action": "elasticloadbalancing:DeregisterTargets",
                    "Resource": list(target_group_arns),
                },
                write_its_logs(log_group_arn),
            ],
        }
    )


@dataclass(frozen=True)
class OutOfServiceArgs:
    stack: str
    cloud: Cloud
    # The groups the ALB sends the API to: its own, and the canary group where the stack rolls by
    # traffic share.
    target_group_arns: Sequence[pulumi.Input[str]]
    log_retention_days: int
    # The stack's key, which encrypts the function's log group as every log group of the stack.
    kms_key_arn: pulumi.Input[str]
    tags: Mapping[str, str]


class OutOfService(pulumi.ComponentResource):
    """The spot warnings' rule and the function it invokes."""

    function_arn: pulumi.Output[str]

    def __init__(self, name: str, args: OutOfServiceArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:nodes:OutOfService", name, None, opts)
        function = python_function(
            name,
            PythonFunction(
                cloud=args.cloud,
                function_name=function_name(args.stack),
                description=f"Frontier {args.stack}: a spot host out of the load balancer on its warning",
                role_description=f"Frontier {args.stack}: takes warned spot hosts out of the target groups",
                handler="out_of_service.handler",
                files=FUNCTION_FILES,
                timeout_s=TIMEOUT_S,
                policy=lambda logs: pulumi.Output.all(logs, *args.target_group_arns).apply(
                    lambda a: out_of_service_policy(a[1:], a[0])
                ),
                tags=args.tags,
                log_retention_days=args.log_retention_days,
                environment={
                    out_of_service.TARGET_GROUPS_ENV: pulumi.Output.all(*args.target_group_arns).apply(
                        ",".join
                    )
                },
                log_kms_key_arn=args.kms_key_arn,
            ),
            self,
        )
        rule = aws.cloudwatch.EventRule(
            f"{name}-rule",
            name=function_name(args.stack),
            description=f"Frontier {args.stack}: spot interruption warnings, to take the host out at once",
            event_pattern=json.dumps(warning_pattern()),
            tags=dict(args.tags),
            opts=pulumi.ResourceOptions(parent=self),
        )
        invoked_by_rule(function, rule, (f"{name}-rule", f"{name}-target"), args.cloud, self)
        self.function_arn = function.arn
        self.register_outputs({"function_arn": function.arn})


def needs_out_of_service(settings: Settings) -> bool:
    """Where the ALB fronts a serving group that buys spot."""
    return settings.gateway is None and any(
        isinstance(group.capacity, SpotCapacity) and settings.pools_on(group)
        for group in settings.node_groups
    )
