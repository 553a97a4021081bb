"""Takes a spot host out of the stack's load balancer as soon as EC2 warns it will be interrupted.

The host's agent sees the same warning on IMDS within its 5 s poll and fails its runtime's
readiness at once, but an ALB learns of that only from its own health checks: two failures at
intervals of at least 5 s (10 s on the shipped stacks), while new requests keep arriving. EventBridge
invokes this function with the warning, seconds after EC2 emits it; the function deregisters the
instance from each of the stack's target groups that holds it (the API's group, and the canary
group of a rollout by traffic share). A deregistered target gets no new request from that moment,
and the requests it holds finish within the group's deregistration delay, well inside the two
minutes the warning gives.

Only the spot warning moves a host: a rebalance recommendation is advice (the host keeps serving
and its group prefetches a replacement), and a Capacity Block's warning names a reservation, whose
group the scheduled hand-over drains (infra/interruptions.py). An instance the stack's groups do
not hold (another stack's, a gateway host) is left alone.

It runs in Lambda's Python runtime with the runtime's boto3; nothing of the toolkit travels with it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

# EventBridge's detail type of the two-minute warning (source aws.ec2), from the EC2 user guide's
# "Spot Instance interruption notices".
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
# The function's environment, set by the program that creates it (infra/out_of_service.py): the
# target groups' ARNs, comma-separated.
TARGET_GROUPS_ENV = "FRONTIER_TARGET_GROUP_ARNS"


def handler(event: Mapping[str, Any], context: object = None) -> dict[str, Any]:
    if event.get("detail-type") != SPOT_WARNING:
        return {"instance": None, "deregistered": []}
    import boto3  # the Lambda runtime's; imported here so the program can import the names above

    instance = event["detail"]["instance-id"]
    groups = [arn for arn in os.environ[TARGET_GROUPS_ENV].split(",") if arn]
    taken = take_out(boto3.client("elbv2"), instance, groups)
    print(f"{instance}: out of {len(taken)} of {len(groups)} target groups")
    return {"instance": instance, "deregistered": taken}


def take_out(client: Any, instance: str, target_groups: Iterable[str]) -> list[str]:
    """Deregister ``instance`` from each group that holds it and is not draining it already; the
    groups it left."""
    taken = []
    for arn in target_groups:
        held = client.describe_target_health(TargetGroupArn=arn)["TargetHealthDescriptions"]
        if not any(d["Target"]["Id"] == instance and d["TargetHealth"]["State"] != "draining" for d in held):
            continue
        # By instance alone: auto scaling registered it on the group's own port (no override).
        client.deregister_targets(TargetGroupArn=arn, Targets=[{"Id": instance}])
        taken.append(arn)
    return taken
