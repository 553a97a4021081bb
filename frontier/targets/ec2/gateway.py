"""Rolling the gateway's hosts on EC2: an instance refresh of its auto scaling group.

Gateway hosts keep no state and boot everything from the history bucket (the wheels and
``gateway.yaml`` that ``fab gateway.publish`` uploads, ``templates/gateway-cloud-init.yaml.j2``),
so a new gateway version or config reaches them as new hosts, not as changes on old ones. AWS's
instance refresh does that without dropping capacity: with a minimum healthy percentage of 100 and
a maximum of 200 it launches each replacement first, waits until the load balancer's health check
passes (the group's health check type is ELB) and the warm-up is over, and only then terminates an
old host, whose target drains for the target group's deregistration delay first.

Two ways start one, with the same preferences (:data:`GATEWAY_REFRESH`):

- ``pulumi up`` when the launch template changes (the user data names the gateway config's digest,
  so a changed ``gateway:`` section is a new template version; infra/gateway.py);
- ``fab gateway.roll`` after ``fab gateway.publish`` (same template, new files in the bucket: every
  host is replaced, matching or not), which waits for it and reports its progress.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError
from frontier_hostside.names import ROLE_TAG, STACK_TAG

from frontier.errors import FrontierError

GATEWAY_ROLE = "gateway"
# The refresh's terminal states (AutoScaling DescribeInstanceRefreshes).
DONE = {"Successful", "Failed", "Cancelled", "RollbackSuccessful", "RollbackFailed", "Baseline"}
POLL_S = 15.0


@dataclass(frozen=True)
class RefreshPreferences:
    """How a gateway refresh keeps capacity: never below the desired count of healthy hosts."""

    min_healthy_percentage: int = 100
    # Up to twice the desired count while replacements warm up: AWS allows max - min <= 100.
    max_healthy_percentage: int = 200
    # After a replacement is InService and healthy in the target group: its key digests loaded and
    # its replicas found, before the next old host goes.
    instance_warmup_s: int = 60

    def boto3(self, *, skip_matching: bool) -> dict[str, Any]:
        return {
            "MinHealthyPercentage": self.min_healthy_percentage,
            "MaxHealthyPercentage": self.max_healthy_percentage,
            "InstanceWarmup": self.instance_warmup_s,
            "SkipMatching": skip_matching,
        }


GATEWAY_REFRESH = RefreshPreferences()


class GatewayRollError(FrontierError):
    """The gateway's group could not be found, refreshed, or its refresh did not succeed."""


@dataclass(frozen=True)
class RefreshProgress:
    refresh_id: str
    status: str
    percent: int
    to_update: int
    reason: str = ""


def gateway_group_name(autoscaling: Any, stack: str, region: str) -> str:
    """The gateway's auto scaling group: tagged with the stack and the gateway's role."""
    wanted = {STACK_TAG: stack, ROLE_TAG: GATEWAY_ROLE}
    for page in autoscaling.get_paginator("describe_auto_scaling_groups").paginate():
        for found in page["AutoScalingGroups"]:
            tags = {t["Key"]: t["Value"] for t in found.get("Tags", [])}
            if all(tags.get(k) == v for k, v in wanted.items()):
                return str(found["AutoScalingGroupName"])
    raise GatewayRollError(
        f"stack {stack!r}: no auto scaling group tagged {STACK_TAG}={stack} and {ROLE_TAG}={GATEWAY_ROLE} "
        f"in {region} (does the stack have a gateway section, and has `pulumi up` run?)"
    )


def start_gateway_refresh(
    autoscaling: Any, group: str, preferences: RefreshPreferences = GATEWAY_REFRESH
) -> str:
    """Start replacing every host of ``group`` (matching ones too: their files in S3 changed)."""
    try:
        answer = autoscaling.start_instance_refresh(
            AutoScalingGroupName=group, Strategy="Rolling", Preferences=preferences.boto3(skip_matching=False)
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "InstanceRefreshInProgress":
            raise GatewayRollError(
                f"the gateway group {group} is already being refreshed (`pulumi up` or another "
                "`fab gateway.roll`): wait for it, or cancel it in the console"
            ) from None
        raise
    return str(answer["InstanceRefreshId"])


def refresh_progress(autoscaling: Any, group: str, refresh_id: str) -> RefreshProgress:
    [found] = autoscaling.describe_instance_refreshes(
        AutoScalingGroupName=group, InstanceRefreshIds=[refresh_id]
    )["InstanceRefreshes"]
    return RefreshProgress(
        refresh_id,
        found["Status"],
        int(found.get("PercentageComplete", 0)),
        int(found.get("InstancesToUpdate", 0)),
        found.get("StatusReason", ""),
    )


def wait_for_refresh(
    autoscaling: Any,
    group: str,
    refresh_id: str,
    *,
    timeout_s: float,
    poll_s: float = POLL_S,
    report: Callable[[RefreshProgress], None] = lambda progress: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> RefreshProgress:
    """Poll the refresh until it ends; raise unless it succeeded, or when ``timeout_s`` passes (the
    refresh itself goes on: AWS keeps capacity whatever this command does)."""
    deadline = clock() + timeout_s
    last: RefreshProgress | None = None
    while True:
        progress = refresh_progress(autoscaling, group, refresh_id)
        if progress != last:
            report(progress)
            last = progress
        if progress.status in DONE:
            break
        if clock() >= deadline:
            raise GatewayRollError(
                f"the gateway's refresh {refresh_id} of {group} is still {progress.status} "
                f"({progress.percent}% done) after {timeout_s:.0f} s; it goes on without this command"
            )
        sleep(poll_s)
    if progress.status != "Successful":
        raise GatewayRollError(
            f"the gateway's refresh {refresh_id} of {group} ended {progress.status}"
            + (f": {progress.reason}" if progress.reason else "")
        )
    return progress
