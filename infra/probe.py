"""The synthetic probe on EC2: a Lambda function an EventBridge schedule runs every minute, sending
the fixed request of ``frontier_hostside/probe.py`` through the stack's public endpoint and putting
``ProbeSuccess`` and ``ProbeLatency`` into CloudWatch, where the ``probe-failing`` alarm reads them
(:mod:`frontier.alarms`, made by :mod:`infra.monitoring`).

A scheduled Lambda, not a CloudWatch Synthetics canary: the canary runs its own runtime's library
(``aws_synthetics``, with a browser) that exists nowhere but in AWS, needs an artifacts bucket, and
costs per run; the Lambda runs the very probe module the Kubernetes CronJob and the local stack run,
which the tests run against a real HTTP server. It runs outside the VPC, as a client does, so it
meets the endpoint's DNS, TLS and the load balancer's rules as clients meet them — where the load
balancer would let it in. Where it would not (:func:`probe_door`), the function runs in the VPC's
private subnets with a security group of its own, HTTPS out only: an internal load balancer is
reached at its private addresses (and admits the probe's group where it lists client ranges); an
internet-facing one that lists client ranges is reached through the VPC's NAT, whose addresses it
then admits on 443. Either way the probe still calls the public name over TLS.

It asks each model with the key of that model's pool (the first of the pool's own secret), which
the gateway's probe tenant knows. Its role may put metrics in the runtime's namespace only, read the
pools' key secrets (and decrypt them with the stack's key), and write its own log group.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import frontier_hostside
import pulumi
import pulumi_aws as aws
from frontier_hostside import probe
from frontier_hostside.names import CLOUDWATCH_NAMESPACE

from frontier.alarms import PROBE_INTERVAL_S, PROBE_TIMEOUT_S, probe_job_name
from frontier.config.schema import Edge
from frontier.identity.cloud import Cloud
from infra.functions import synthetic_probe
from infra.lambda_function import (
    FunctionVpc,
    PythonFunction,
    invoked_by_rule,
    python_function,
    reach_its_vpc,
    write_its_logs,
)
from infra.security_groups import ANYWHERE, ProbeDoor

FUNCTION_DIR = Path(synthetic_probe.__file__).parent
# What travels in the function's archive: the handler and the host side's probe with its names.
FUNCTION_FILES = {
    "synthetic_probe.py": FUNCTION_DIR / "synthetic_probe.py",
    **{
        f"{frontier_hostside.PACKAGE}/{name}": frontier_hostside.PACKAGE_DIR / name
        for name in ("__init__.py", "names.py", "probe.py")
    },
}
# The probe's own timeout per model, and room to publish.
TIMEOUT_S = PROBE_TIMEOUT_S + 10
SCHEDULE = f"rate({PROBE_INTERVAL_S // 60} minute)"


@dataclass(frozen=True)
class SyntheticProbeArgs:
    stack: str
    cloud: Cloud
    endpoint: pulumi.Input[str]
    models: Sequence[str]
    # The secret holding the key the probe presents to each model (its pool's key set: its first
    # key), in the order of ``models``.
    key_secret_arns: Sequence[pulumi.Input[str]]
    kms_key_arn: pulumi.Input[str]
    log_retention_days: int
    tags: Mapping[str, str]
    # Inside the VPC where the load balancer would not admit it from AWS's network (probe_door).
    vpc: FunctionVpc | None = None


def probe_door(edge: Edge, vpc_cidr: str, nat_addresses: Sequence[pulumi.Input[str]]) -> ProbeDoor | None:
    """How the probe gets in where the load balancer would refuse a Lambda's public address: an
    internal one has none to reach, one that lists client ranges refuses AWS's. None: it needs no door."""
    if edge.scheme == "internal":
        return ProbeDoor(egress_cidr=vpc_cidr, from_group=bool(edge.allow_cidrs))
    if edge.allow_cidrs:
        return ProbeDoor(egress_cidr=ANYWHERE, from_addresses=tuple(nat_addresses))
    return None


def probe_policy(
    key_secret_arns: Sequence[str], kms_key_arn: str, log_group_arn: str, in_vpc: bool = False
) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "PublishTheProbesFigures",
                    "Effect": "Allow",
                    "Action": "cloudwatch:PutMetricData",
                    "Resource": "*",  # PutMetricData has no resource; the namespace is the scope
                    "Condition": {"StringEquals": {"cloudwatch:namespace": CLOUDWATCH_NAMESPACE}},
                },
                {
                    "Sid": "ReadTheProbesKey",
                    "Effect": "Allow",
                    "Action": "secretsmanager:GetSecretValue",
                    "Resource": key_secret_arns[0] if len(key_secret_arns) == 1 else list(key_secret_arns),
                },
                {
                    "Sid": "DecryptTheProbesKey",
                    "Effect": "Allow",
                    "Action": "kms:Decrypt",
                    "Resource": kms_key_arn,
                },
                write_its_logs(log_group_arn),
                *([reach_its_vpc()] if in_vpc else []),
            ],
        }
    )


def synthetic_probe(name: str, args: SyntheticProbeArgs, parent: pulumi.Resource) -> aws.lambda_.Function:
    """The probe's resources, children of ``parent`` (the stack's monitoring: one concern)."""
    function_name = probe_job_name(args.stack)
    function = python_function(
        name,
        PythonFunction(
            cloud=args.cloud,
            function_name=function_name,
            description=f"Frontier {args.stack}: a fixed request through the public endpoint every minute",
            role_description=f"Frontier {args.stack}: the synthetic probe publishes its figures",
            handler="synthetic_probe.handler",
            files=FUNCTION_FILES,
            timeout_s=TIMEOUT_S,
            policy=lambda logs: pulumi.Output.all(args.kms_key_arn, logs, *args.key_secret_arns).apply(
                lambda a: probe_policy(list(dict.fromkeys(a[2:])), a[0], a[1], in_vpc=args.vpc is not None)
            ),
            tags=args.tags,
            log_retention_days=args.log_retention_days,
            environment={
                probe.ENDPOINT_ENV: args.endpoint,
                probe.MODELS_ENV: ",".join(args.models),
                probe.STACK_ENV: args.stack,
                probe.KEY_SECRET_ENV: pulumi.Output.all(*args.key_secret_arns).apply(",".join),
                probe.TIMEOUT_ENV: str(PROBE_TIMEOUT_S),
            },
            log_kms_key_arn=args.kms_key_arn,
            vpc=args.vpc,
        ),
        parent,
    )
    schedule = aws.cloudwatch.EventRule(
        f"{name}-schedule",
        name=function_name,
        description=f"Frontier {args.stack}: run the synthetic probe every minute",
        schedule_expression=SCHEDULE,
        tags=dict(args.tags),
        opts=pulumi.ResourceOptions(parent=parent),
    )
    invoked_by_rule(function, schedule, (f"{name}-schedule", f"{name}-target"), args.cloud, parent)
    return function
