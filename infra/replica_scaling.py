"""A group whose replica spans several hosts gives up whole replicas.

Its auto scaling group asks a Lambda function before it terminates hosts (a custom termination
policy, ``infra/functions/replica_terminator.py``), which reads the replicas' slots in the history
bucket and answers with hosts that hold none, then members of broken replicas, then whole replicas —
never half of one. The function reads only its group's slots, runs for at most AWS's two seconds,
and is invoked by auto scaling's service-linked role alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import frontier_hostside
import pulumi
import pulumi_aws as aws
from frontier_hostside.names import REPLICAS_PREFIX

from frontier.identity.cloud import Cloud
from infra.functions import replica_terminator
from infra.lambda_function import PythonFunction, python_function, write_its_logs

FUNCTION_DIR = Path(replica_terminator.__file__).parent
# What travels in the function's archive: the policy, and the slots' layout it reads.
FUNCTION_FILES = {
    "replica_terminator.py": FUNCTION_DIR / "replica_terminator.py",
    **{
        f"{frontier_hostside.PACKAGE}/{name}": frontier_hostside.PACKAGE_DIR / name
        for name in ("__init__.py", "names.py", "rendezvous.py")
    },
}
# Auto scaling waits at most 2 s for the answer (and asks again after a failure).
TIMEOUT_S = 2


@dataclass(frozen=True)
class ReplicaTerminationArgs:
    stack: str
    cloud: Cloud
    node_group: str
    nodes_per_replica: int
    history_bucket: pulumi.Input[str]
    # The group's pool's history prefix, under which its hosts claim ``replicas/<group>/`` slots.
    history_prefix: str
    kms_key_arn: pulumi.Input[str]
    autoscaling_role_arn: str
    tags: Mapping[str, str]
    # The stack's log retention (longer on production stacks, as every log group of theirs).
    log_retention_days: int = 30
    # What makes the service-linked role in a fresh account (a principal must exist to be named).
    after: Sequence[pulumi.Resource] = ()


def terminator_policy(bucket: str, slots_prefix: str, kms_key_arn: str, log_group_arn: str) -> str:
    """Read the group's slots (and decrypt them: the history bucket is SSE-KMS), write its logs."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "ListItsGroupsSlots",
                    "Effect": "Allow",
                    "Action": "s3:ListBucket",
                    "Resource": f"arn:aws:s3:::{bucket}",
                    "Condition": {"StringLike": {"s3:prefix": [f"{slots_prefix}*"]}},
                },
                {
                    "Sid": "ReadItsGroupsSlots",
                    "Effect": "Allow",
                    "Action": "s3:GetObject",
                    "Resource": f"arn:aws:s3:::{bucket}/{slots_prefix}*",
                },
                {
                    "Sid": "DecryptTheSlots",
                    "Effect": "Allow",
                    "Action": "kms:Decrypt",
                    "Resource": kms_key_arn,
                },
                write_its_logs(log_group_arn),
            ],
        }
    )


class ReplicaTermination(pulumi.ComponentResource):
    """The custom termination policy of one multi-node group: ``function_arn`` goes first in the
    group's ``termination_policies``."""

    function_arn: pulumi.Output[str]

    def __init__(
        self, name: str, args: ReplicaTerminationArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("frontier:nodes:ReplicaTermination", name, None, opts)
        function_name = f"frontier-{args.stack}-{args.node_group}-terminator"
        slots_prefix = f"{args.history_prefix}{REPLICAS_PREFIX}{args.node_group}/"
        function = python_function(
            name,
            PythonFunction(
                cloud=args.cloud,
                function_name=function_name,
                description=f"Frontier {args.stack}: {args.node_group} gives up whole replicas",
                role_description=f"Frontier {args.stack}: {args.node_group}'s termination policy reads its replica slots",
                handler="replica_terminator.handler",
                files=FUNCTION_FILES,
                timeout_s=TIMEOUT_S,
                policy=lambda logs: pulumi.Output.all(args.history_bucket, args.kms_key_arn, logs).apply(
                    lambda a: terminator_policy(a[0], slots_prefix, a[1], a[2])
                ),
                tags=args.tags,
                log_retention_days=args.log_retention_days,
                environment={
                    replica_terminator.BUCKET_ENV: args.history_bucket,
                    replica_terminator.PREFIX_ENV: args.history_prefix,
                    replica_terminator.GROUP_ENV: args.node_group,
                    replica_terminator.NODES_ENV: str(args.nodes_per_replica),
                },
            ),
            self,
        )
        # An unqualified ARN in the group's policies: the resource policy is on the unpublished
        # version, and only auto scaling's service-linked role may call it.
        invoke = aws.lambda_.Permission(
            f"{name}-autoscaling",
            action="lambda:InvokeFunction",
            function=function.name,
            principal=args.autoscaling_role_arn,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.after)),
        )
        self.function_arn = pulumi.Output.all(function.arn, invoke.id).apply(lambda a: a[0])
        self.register_outputs({"function_arn": self.function_arn})
