"""Spot and Capacity Blocks on EC2: how a node group buys its hosts, and where their notices go.

* **Spot** (``capacity.market: spot``, frontier/config/purchase.py): the auto scaling group takes a
  MixedInstancesPolicy — an on-demand base, spot above it, the group's type and the listed types
  with the same GPUs as overrides, capacity-optimized allocation — and capacity rebalancing, so
  it launches a replacement on a rebalance recommendation. On the host, the agent's
  ``interruptions`` command drains the runtime on the two-minute notice (frontier_hostside.interruption).
* **Capacity Blocks** (``capacity.market: capacity-block``): the launch template targets the
  reservation with market type ``capacity-block``. ``warning_minutes`` (40) before the block ends
  two scheduled actions move the capacity: the block's group goes to 0 (each host drained by the
  terminate lifecycle hook's ``watch``), and the fallback group's floor and desired size rise to
  the block's desired size. Scheduled actions, not the deploy side: they run whether or not any
  operator or ``fab`` process is up at 10:50 UTC, and a ``pulumi up`` shows them.
* **Notices** (:class:`InterruptionQueue`): one EventBridge rule sends EC2's Spot Instance
  Interruption Warnings, Instance Rebalance Recommendations and Capacity Block expiration warnings
  to one SQS queue per stack (``frontier-<stack>-interruptions``). ``fab status`` reads it without
  consuming (frontier/hosts/notices.py); on EKS the Node Termination Handler drains nodes from
  the same queue.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import pulumi
import pulumi_aws as aws

from frontier.config.purchase import CapacityBlock, SpotCapacity, has_notice_queue, notice_queue_name
from frontier.config.schema import NodeGroup
from infra.functions.out_of_service import SPOT_WARNING

# EventBridge detail types of the notices (source aws.ec2). Sources: the EC2 user guide's "Spot
# Instance interruption notices" (SPOT_WARNING, beside the function that acts on it),
# "EC2 instance rebalance recommendations" and "Monitor Capacity Blocks using EventBridge" pages.
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
CAPACITY_BLOCK_WARNING = "Capacity Block Reservation Expiration Warning"
NOTICE_TYPES = (SPOT_WARNING, REBALANCE_RECOMMENDATION, CAPACITY_BLOCK_WARNING)
# A notice matters for minutes; one nobody read within a day is history, not news.
NOTICE_RETENTION_S = 86_400


queue_name = notice_queue_name


def mixed_instances_policy(
    group: NodeGroup, template_id: pulumi.Input[str], version: pulumi.Input[str]
) -> dict[str, Any] | None:
    """The group's MixedInstancesPolicy where it buys spot; None where it buys one way only."""
    spot = group.capacity
    if not isinstance(spot, SpotCapacity):
        return None
    types = [group.instance_type, *spot.instance_types]
    return {
        "instances_distribution": {
            "on_demand_base_capacity": spot.on_demand_base,
            "on_demand_percentage_above_base_capacity": spot.on_demand_above_base_percent,
            "on_demand_allocation_strategy": "prioritized",
            "spot_allocation_strategy": spot.allocation_strategy,
        },
        "launch_template": {
            "launch_template_specification": {"launch_template_id": template_id, "version": version},
            "overrides": [{"instance_type": t} for t in types],
        },
    }


def capacity_rebalance(group: NodeGroup) -> bool | None:
    spot = group.capacity
    return spot.capacity_rebalance if isinstance(spot, SpotCapacity) else None


def capacity_block_template(group: NodeGroup) -> dict[str, Any]:
    """The launch template's arguments that put its hosts in the group's Capacity Block ({} elsewhere)."""
    block = group.capacity
    if not isinstance(block, CapacityBlock):
        return {}
    return {
        "instance_market_options": {"market_type": "capacity-block"},
        "capacity_reservation_specification": {
            "capacity_reservation_target": {"capacity_reservation_id": block.reservation_id}
        },
    }


def capacity_block_handover(
    name: str,
    block_group: NodeGroup,
    block_asg: pulumi.Input[str],
    fallback: NodeGroup,
    fallback_asg: pulumi.Input[str],
    opts: pulumi.ResourceOptions,
) -> tuple[aws.autoscaling.Schedule, aws.autoscaling.Schedule]:
    """At the block's warning: its group to zero, the fallback group up to the block's size."""
    block = block_group.capacity
    assert isinstance(block, CapacityBlock)
    # The fallback takes the block's hosts, within its own max_size.
    moved = min(block_group.desired_size, fallback.max_size)
    drain = aws.autoscaling.Schedule(
        f"{name}-block-drain",
        scheduled_action_name=f"{block_group.name}-capacity-block-ends",
        autoscaling_group_name=block_asg,
        start_time=_utc(block),
        min_size=0,
        max_size=0,
        desired_capacity=0,
        opts=opts,
    )
    rise = aws.autoscaling.Schedule(
        f"{name}-block-fallback",
        scheduled_action_name=f"{block_group.name}-capacity-block-fallback",
        autoscaling_group_name=fallback_asg,
        start_time=_utc(block),
        min_size=max(fallback.min_size, moved),
        max_size=-1,
        desired_capacity=max(fallback.desired_size, moved),
        opts=opts,
    )
    return drain, rise


def _utc(block: CapacityBlock) -> str:
    """The warning's moment as the scheduled action's start_time takes it (UTC, ISO 8601)."""
    return block.drain_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def notice_pattern() -> dict[str, Any]:
    return {"source": ["aws.ec2"], "detail-type": list(NOTICE_TYPES)}


def queue_policy(queue_arn: str, rule_arn: str) -> dict[str, Any]:
    """Only this stack's rule may send to the queue."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "EventBridgeNotices",
                "Effect": "Allow",
                "Principal": {"Service": "events.amazonaws.com"},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"ArnEquals": {"aws:SourceArn": rule_arn}},
            }
        ],
    }


@dataclass(frozen=True)
class InterruptionQueueArgs:
    stack: str
    tags: Mapping[str, str]


class InterruptionQueue(pulumi.ComponentResource):
    """EC2's spot, rebalance and Capacity Block notices on one SQS queue of the stack."""

    queue_url: pulumi.Output[str]
    queue_arn: pulumi.Output[str]

    def __init__(
        self, name: str, args: InterruptionQueueArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("frontier:nodes:InterruptionQueue", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        queue = aws.sqs.Queue(
            f"{name}-queue",
            name=queue_name(args.stack),
            message_retention_seconds=NOTICE_RETENTION_S,
            sqs_managed_sse_enabled=True,
            tags=dict(args.tags),
            opts=child,
        )
        rule = aws.cloudwatch.EventRule(
            f"{name}-rule",
            name=queue_name(args.stack),
            description=f"Frontier {args.stack}: spot interruption, rebalance and Capacity Block warnings",
            event_pattern=json.dumps(notice_pattern()),
            tags=dict(args.tags),
            opts=child,
        )
        policy = aws.sqs.QueuePolicy(
            f"{name}-policy",
            queue_url=queue.url,
            policy=pulumi.Output.all(queue.arn, rule.arn).apply(
                lambda a: json.dumps(queue_policy(a[0], a[1]))
            ),
            opts=child,
        )
        aws.cloudwatch.EventTarget(
            f"{name}-target",
            rule=rule.name,
            arn=queue.arn,
            # A notice sent before the queue lets the rule in would be lost.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy]),
        )
        self.queue_url, self.queue_arn = queue.url, queue.arn
        self.register_outputs({"queue_url": queue.url, "queue_arn": queue.arn})


def notice_queue(stack: str, tags: Mapping[str, str], node_groups: tuple[NodeGroup, ...]) -> InterruptionQueue | None:
    """The stack's notice queue where a group buys spot or a Capacity Block; None where all buy on-demand."""
    if not has_notice_queue(node_groups):
        return None
    return InterruptionQueue(f"{stack}-interruptions", InterruptionQueueArgs(stack, tags))


def wire_interruptions(
    stack: str,
    tags: Mapping[str, str],
    node_groups: tuple[NodeGroup, ...],
    asg_names: list[pulumi.Output[str]],
) -> InterruptionQueue | None:
    """The notice queue and each Capacity Block's hand-over, where a group buys spot or a block.

    ``asg_names`` are the auto scaling groups of ``node_groups``, in the same order. A stack that
    buys on-demand only gets neither (no notice would ever arrive).
    """
    queue = notice_queue(stack, tags, node_groups)
    if queue is None:
        return None
    by_name = {g.name: (g, asg) for g, asg in zip(node_groups, asg_names, strict=True)}
    for group, asg in zip(node_groups, asg_names, strict=True):
        if isinstance(group.capacity, CapacityBlock):
            fallback, fallback_asg = by_name[group.capacity.fallback_group]
            capacity_block_handover(
                f"{stack}-{group.name}",
                group,
                asg,
                fallback,
                fallback_asg,
                pulumi.ResourceOptions(parent=queue),
            )
    return queue


def eks_capacity_type(group: NodeGroup) -> str | None:
    """An EKS managed node group's capacity type: SPOT for a spot group (all of it: the stack
    check refuses an on-demand base there), else the default (on-demand)."""
    return "SPOT" if isinstance(group.capacity, SpotCapacity) else None


def eks_instance_types(listed: tuple[str, ...], group: NodeGroup) -> list[str]:
    """The node pool's own list, else the group's type and, for spot, the same-GPU types beside it."""
    if listed:
        return list(listed)
    extra = group.capacity.instance_types if isinstance(group.capacity, SpotCapacity) else ()
    return [group.instance_type, *extra]
