"""When a GPU group gives hosts back: only when what runs would fit on a replica fewer.

Queue depth says when to add capacity, not when to remove it: at a steady load nothing waits, so a
policy that scales in on an empty queue (or target tracking on queue depth, which asks for zero
hosts when the queue is zero) takes away a replica the load still needs, the queue comes back, and
the group flaps. A group here scales out on queue depth and scales in, a replica at a time, only
after ``SCALE_IN_MINUTES`` in which nothing waited *and* the requests running would fit on the
replicas left at ``scale_in_utilisation`` of their concurrency — the local autoscaler's rule
(``frontier/targets/local/autoscaler.py``), here as CloudWatch metric math over what the hosts
publish (every host of a replica publishes its leader's figures, so per-host averages are
per-replica ones) and the group's in-service count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_aws as aws
from frontier_hostside.names import (
    CLOUDWATCH_DIMENSIONS,
    CLOUDWATCH_NAMESPACE,
    QUEUE_DEPTH_METRIC,
    RUNNING_REQUESTS_METRIC,
)

from frontier.config.schema import NodeGroup

SCALE_IN_MINUTES = 10
PERIOD_S = 60


def scale_in_expression(nodes: int, room_per_replica: float) -> str:
    """1 while a replica fewer would do: nothing waits, more than one replica serves, and the hosts'
    running requests (``running`` per host, ``hosts`` in service, ``nodes`` per replica) fit on the
    replicas left at ``room_per_replica`` requests each."""
    return (
        f"IF(queue <= 0 AND hosts > {nodes} AND running * hosts <= (hosts - {nodes}) * {room_per_replica:g}, 1, 0)"
    )


def step_on_alarm(
    name: str,
    asg_name: pulumi.Input[str],
    adjustment_type: str,
    adjustment: int,
    *,
    opts: pulumi.ResourceOptions,
    warmup_s: int | None = None,
    **alarm: Any,
) -> aws.cloudwatch.MetricAlarm:
    """A step policy on ``asg_name`` that adjusts its capacity by ``adjustment`` (``adjustment_type``:
    ``ChangeInCapacity`` or ``ExactCapacity``), and the alarm that runs it (``alarm``: its condition and
    what it reads), both named ``name``."""
    policy = aws.autoscaling.Policy(
        name,
        autoscaling_group_name=asg_name,
        policy_type="StepScaling",
        adjustment_type=adjustment_type,
        step_adjustments=[{"scaling_adjustment": adjustment, "metric_interval_lower_bound": "0"}],
        estimated_instance_warmup=warmup_s,
        opts=opts,
    )
    return aws.cloudwatch.MetricAlarm(
        name,
        # No figures (no traffic, hosts starting, a publisher down) is no evidence either way.
        treat_missing_data="notBreaching",
        alarm_actions=[policy.arn],
        opts=opts,
        **alarm,
    )


def scale_in_by_load(
    name: str,
    asg_name: pulumi.Input[str],
    group: NodeGroup,
    *,
    nodes: int,
    max_concurrency: int,
    dimensions: tuple[str, str],
    opts: pulumi.ResourceOptions,
) -> aws.cloudwatch.MetricAlarm:
    """A step policy that removes one replica (``nodes`` hosts) and the alarm that fires it."""
    runtime: Mapping[str, str] = dict(zip(CLOUDWATCH_DIMENSIONS, dimensions, strict=True))

    def published(query_id: str, metric: str) -> dict:
        return {
            "id": query_id,
            "metric": {
                "namespace": CLOUDWATCH_NAMESPACE,
                "metric_name": metric,
                "dimensions": runtime,
                "period": PERIOD_S,
                "stat": "Average",
            },
            "return_data": False,
        }

    return step_on_alarm(
        f"{name}-in",
        asg_name,
        "ChangeInCapacity",
        -nodes,
        opts=opts,
        alarm_description=(
            f"{group.name}: nothing waited and the running requests fit on a replica fewer at "
            f"{group.scale_in_utilisation:.0%} of their concurrency, for {SCALE_IN_MINUTES} minutes"
        ),
        comparison_operator="GreaterThanOrEqualToThreshold",
        threshold=1,
        evaluation_periods=SCALE_IN_MINUTES,
        datapoints_to_alarm=SCALE_IN_MINUTES,
        metric_queries=[
            published("queue", QUEUE_DEPTH_METRIC),
            published("running", RUNNING_REQUESTS_METRIC),
            {
                "id": "hosts",
                "metric": {
                    "namespace": "AWS/AutoScaling",
                    "metric_name": "GroupInServiceInstances",
                    "dimensions": {"AutoScalingGroupName": asg_name},
                    "period": PERIOD_S,
                    "stat": "Average",
                },
                "return_data": False,
            },
            {
                "id": "fits_on_fewer",
                "expression": scale_in_expression(nodes, max_concurrency * group.scale_in_utilisation),
                "label": "a replica fewer would do",
                "return_data": True,
            },
        ],
    )
