"""GPU node groups: a launch template and an auto scaling group per ``node_groups[]`` entry.

Hosts boot the AWS Deep Learning Base AMI (Ubuntu 22.04, NVIDIA driver and container toolkit
preinstalled; the driver script trusts it) pinned by id in the stack, with IMDSv2
required, encrypted gp3 root and model-cache volumes, no public address, and the cloud-init user data
rendered by :func:`frontier.render.boot.render_cloud_init`. The ASG spreads hosts over the private subnets;
a group that needs EFA (``efa: true``, or a model sharded across nodes) gets a cluster placement
group in one AZ instead, as EFA requires.

``fab`` finds hosts by these tags on every instance: ``frontier:stack``, ``frontier:node-group`` and
``frontier:role = runtime``.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pulumi
import pulumi_aws as aws
from frontier_gateway.hold import HELD_REQUESTS_CW_METRIC
from frontier_hostside.names import (
    CACHE_DEVICE_NAME,
    CLOUDWATCH_DIMENSIONS,
    CLOUDWATCH_NAMESPACE,
    HOST_BOOT_ALLOWANCE_S,
    LAUNCH_HOOK,
    QUEUE_DEPTH_METRIC,
    RUNNING_REQUESTS_METRIC,
    TERMINATE_HOOK,
    TTFT_CW_METRIC,
)

from frontier.config import host_image
from frontier.config.hardware import (  # re-exported: the tests and `fab ami.latest` share them
    CPU_AMI_PARAMETER,  # noqa: F401
    GPU_AMI_PARAMETER,  # noqa: F401
    ami_parameter,
    architecture,
    instance_store,
    uses_efa,
)
from frontier.config.schedule import cron_of
from frontier.config.schema import NodeGroup, PoolSettings, Settings
from frontier.render.boot import host_tools
from infra.errors import ProvisionError
from infra.interruptions import capacity_block_template, capacity_rebalance, mixed_instances_policy
from infra.replica_scaling import ReplicaTermination, ReplicaTerminationArgs
from infra.scale_in import scale_in_by_load, step_on_alarm
from infra.tags import NODE_GROUP_TAG, ROLE_TAG, RUNTIME_ROLE

# Fast volume for weights: loading a 140 GB model at 1000 MiB/s takes ~2.5 min instead of ~19 at gp3's default.
CACHE_IOPS = 4000
CACHE_THROUGHPUT_MIBPS = 1000
# Containers on the host (the runtime runs in one) are one network hop further from IMDS.
METADATA_HOP_LIMIT = 2
MAX_GRACE_S = 7200
# Lifecycle hooks wait at most 2 h (AWS's limit for one heartbeat timeout).
MAX_HOOK_S = 7200
BOOT_ALLOWANCE_S = HOST_BOOT_ALLOWANCE_S
# Beyond the drain itself, before a terminating host is let go regardless.
TERMINATE_MARGIN_S = 60
# The process the first successful deploy resumes (frontier/targets/ec2/group.py: REPLACE_UNHEALTHY).
REPLACE_UNHEALTHY = "ReplaceUnhealthy"


def launch_timeout_s(readiness_timeout_s: float) -> int:
    """How long the launch hook waits for a host to bootstrap and be ready before ABANDON."""
    return min(MAX_HOOK_S, BOOT_ALLOWANCE_S + math.ceil(readiness_timeout_s))


def terminate_timeout_s(settings: Settings, pool: PoolSettings) -> int:
    """How long a scale-in waits for a host of ``pool`` to drain (deregistration, then its runtime's drain)."""
    drain = settings.rollout.deregistration_delay_s + math.ceil(pool.runtime.drain_timeout_s)
    return min(MAX_HOOK_S, max(30, drain + TERMINATE_MARGIN_S))


def refresh_preferences(settings: Settings, group: NodeGroup) -> dict:
    """Instance refresh: surge where max_size leaves room (launch first, then retire), else one
    batch of hosts unavailable at a time; either way each new host passes the launch hook first."""
    desired = max(1, group.desired_size)
    surge = min(settings.rollout.max_surge, group.max_size - group.desired_size)
    if surge > 0:
        healthy = {
            "min_healthy_percentage": 100,
            "max_healthy_percentage": min(200, 100 + math.ceil(100 * surge / desired)),
        }
    else:
        down = min(desired, settings.rollout.batch_size)
        healthy = {
            "min_healthy_percentage": max(0, 100 - math.ceil(100 * down / desired)),
            "max_healthy_percentage": 100,
        }
    return {
        **healthy,
        # Past the hook a new host is ready; the warm-up is the metric gate's window.
        "instance_warmup": str(math.ceil(settings.rollout.gate.window_s)),
        "skip_matching": True,
        "auto_rollback": True,
    }


def uses_instance_store(group: NodeGroup) -> bool:
    return group.model_cache == "instance_store" and instance_store(group.instance_type)[0] > 0


def needs_efa(settings: Settings, group: NodeGroup) -> bool:
    """Whether ``group``'s hosts get EFA: :func:`frontier.config.hardware.uses_efa` for its pools."""
    return uses_efa(group, [pool.runtime for pool in settings.pools_on(group)])


# Canonical's account, which publishes Ubuntu's images.
CANONICAL = "099720109477"


@dataclass(frozen=True)
class MachineImage:
    image_id: str
    root_device_name: str
    root_snapshot_gb: int
    # What `fab ami.bake` installed on it (its frontier:host-tools tag); None for a stock image.
    host_tools: str | None = None


def look_up_image(group: NodeGroup) -> MachineImage:
    """The stack's pinned AMI, then its root device name (the root volume mapping must match it).

    The id comes from ``node_groups[].ami_id``, never from "latest" at every ``pulumi up``: a new
    AMI is a reviewed change of the stack file (``fab ami.latest`` proposes it) and rolls out as an
    instance refresh through the same readiness gate as a launch.
    """
    if not group.ami_id:
        raise ProvisionError(
            f"node_groups[{group.name}].ami_id is empty: pin an AMI (`fab ami.latest` proposes one)"
        )
    return look_up_ami(
        group.ami_id,
        f"node_groups[{group.name}]",
        group.instance_type,
        f"`fab ami.latest` reads {ami_parameter(group)}",
        # The account's own (what `fab ami.bake` makes), AWS's (Deep Learning AMIs) and Canonical's.
        owners=("self", "amazon", CANONICAL),
    )


def look_up_ami(
    image_id: str, field: str, instance_type: str, where_from: str, *, owners: tuple[str, ...]
) -> MachineImage:
    """The AMI ``image_id`` that ``field`` pins for hosts of ``instance_type``, of one of ``owners``:
    refused where its architecture is not the type's (``where_from`` says where a right one comes from)."""
    arch = architecture(instance_type)
    image = aws.ec2.get_ami(
        owners=list(owners),
        filters=[aws.ec2.GetAmiFilterArgs(name="image-id", values=[image_id])],
    )
    if image.architecture != arch:
        raise ProvisionError(
            f"{field}.instance_type = {instance_type!r}: is {arch}, but the AMI "
            f"{image_id} pinned in ami_id is {image.architecture} ({where_from})"
        )
    root = next((m for m in image.block_device_mappings if m.device_name == image.root_device_name), None)
    root_gb = int((root.ebs or {}).get("volume_size") or 0) if root else 0
    return MachineImage(
        image_id=image_id,
        root_device_name=image.root_device_name,
        root_snapshot_gb=root_gb,
        host_tools=(image.tags or {}).get(host_image.CONTENTS_TAG),
    )


def image_problems(settings: Settings, index: int, group: NodeGroup, image: MachineImage) -> Iterator[str]:
    """A closed network cannot install at boot: the image must carry (by its tag) what hosts run.

    Caught here, before the group exists: a host that boots without them stops at its preflight,
    and the group would launch another in its place until ``pulumi up`` gave up.
    """
    if settings.network.egress != "endpoints":
        return
    missing = host_image.missing_from(image.host_tools, host_tools(settings, group))
    if missing:
        carried = "a stock image (no frontier:host-tools tag)" if image.host_tools is None else "an image"
        yield (
            f"node_groups[{index}].ami_id = {image.image_id!r}: {carried} without {', '.join(missing)}; "
            f"network.egress = 'endpoints' reaches no package mirror at boot: bake one with "
            f"`{host_image.bake_command(settings.stack, group.name)}` and pin it here"
        )


ScaleSignal = Literal["queue_depth", "running_requests"]


def scale_out_signal(pool: PoolSettings, group: NodeGroup) -> ScaleSignal:
    """What adds hosts to ``group``: running requests on a disaggregated pool's decode half (each
    stream arrives with its prompt done, so nothing waits while the replicas fill), requests
    waiting everywhere else (a prefill half's queue is its prompts)."""
    if pool.disaggregation is not None and pool.disaggregation.role_of(group) == "decode":
        return "running_requests"
    return "queue_depth"


def ttft_scale_out(settings: Settings, pool: PoolSettings, group: NodeGroup) -> float | None:
    """The TTFT p90 (ms) above which ``group`` adds a replica: the stack's ``slo.ttft_ms``, except on
    a decode half, which makes no first tokens (its prefill half's hosts publish them)."""
    return None if scale_out_signal(pool, group) == "running_requests" else settings.slo.ttft_ms


@dataclass(frozen=True)
class NodeGroupArgs:
    stack: str
    group: NodeGroup
    image: MachineImage
    user_data: str
    instance_profile_arn: pulumi.Input[str]
    security_group_ids: Sequence[pulumi.Input[str]]
    subnet_ids: Sequence[pulumi.Input[str]]
    target_group_arns: Sequence[pulumi.Input[str]]
    efa: bool
    health_check_grace_s: float
    tags: Mapping[str, str]
    # Seconds from a launch to serving (frontier/capacity/startup.py): the scale-out policies do not
    # count a new host's metrics before then, so replicas still loading do not launch more.
    instance_warmup_s: int
    # Launch hook, terminate hook and instance refresh, from the stack (see the functions above).
    launch_timeout_s: int = BOOT_ALLOWANCE_S
    terminate_timeout_s: int = 300
    refresh: Mapping[str, object] | None = None
    # What a booting host reads or needs its role to allow (policies, buckets, secrets, tools): the group's
    # create waits for healthy hosts, so none of it may come after the group.
    boot_dependencies: Sequence[pulumi.Resource] = ()
    # Hosts one replica spans (runtime.nodes_per_replica): the group scales by whole replicas.
    nodes_per_replica: int = 1
    # Where it spans several: the custom termination policy that gives up whole replicas only.
    termination: ReplicaTerminationArgs | None = None
    # Requests one replica runs at once (its pool's runtime.max_concurrency): what scale-in fits into.
    max_concurrency: int = 1
    # What adds hosts: requests waiting (a colocated or a prefill group: prompts queue there) or
    # requests running (a decode group: its streams arrive prefilled, so its queue stays short
    # while its concurrency fills). See :func:`scale_out_signal`.
    scale_on: ScaleSignal = "queue_depth"
    # The stack's slo.ttft_ms: a second scale-out, a replica at a time while the group's
    # TimeToFirstToken p90 stays above it (see :func:`scale_out_on_ttft`). None: none (a decode
    # group makes no first tokens).
    ttft_scale_out_ms: float | None = None
    # Hosts launched at first; None: the group's desired_size (a disaggregated half: its replicas).
    desired_size: int | None = None


class GpuNodeGroup(pulumi.ComponentResource):
    asg_name: pulumi.Output[str]
    asg_arn: pulumi.Output[str]
    launch_template_id: pulumi.Output[str]
    placement_group: pulumi.Output[str] | None

    def __init__(self, name: str, args: NodeGroupArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:nodes:GpuNodeGroup", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        group = args.group
        host_tags = dict(args.tags) | {
            NODE_GROUP_TAG: group.name,
            ROLE_TAG: RUNTIME_ROLE,
            "Name": f"frontier-{args.stack}-{group.name}",
        }

        self.placement_group = None
        subnet_ids = list(args.subnet_ids)
        if args.efa:
            placement = aws.ec2.PlacementGroup(
                f"{name}-placement", strategy="cluster", tags=dict(args.tags), opts=child
            )
            self.placement_group = placement.name
            # A cluster placement group lives in one AZ.
            subnet_ids = subnet_ids[:1]

        template = aws.ec2.LaunchTemplate(
            f"{name}-lt",
            description=f"Frontier {args.stack}: {group.name} ({group.instance_type}, {group.gpu_type})",
            image_id=args.image.image_id,
            instance_type=group.instance_type,
            iam_instance_profile={"arn": args.instance_profile_arn},
            ebs_optimized="true",
            metadata_options={
                "http_endpoint": "enabled",
                "http_tokens": "required",
                "http_put_response_hop_limit": METADATA_HOP_LIMIT,
                "instance_metadata_tags": "disabled",
            },
            # The model cache: the type's own NVMe disks where the stack asks for them (Nitro shows
            # them without a mapping; cloud-init stripes them), else a fast gp3 volume.
            block_device_mappings=[
                self._volume(args.image.root_device_name, group.root_volume_gb),
                *(
                    []
                    if uses_instance_store(group)
                    else [
                        self._volume(
                            CACHE_DEVICE_NAME,
                            group.cache_volume_gb,
                            iops=CACHE_IOPS,
                            throughput=CACHE_THROUGHPUT_MIBPS,
                        )
                    ]
                ),
            ],
            network_interfaces=[
                {
                    "device_index": 0,
                    "network_card_index": 0,
                    "associate_public_ip_address": "false",
                    "delete_on_termination": "true",
                    "security_groups": list(args.security_group_ids),
                    **({"interface_type": "efa"} if args.efa else {}),
                }
            ],
            placement={"group_name": self.placement_group} if self.placement_group else None,
            monitoring={"enabled": True},
            user_data=base64.b64encode(args.user_data.encode()).decode(),
            tag_specifications=[
                {"resource_type": kind, "tags": host_tags}
                for kind in ("instance", "volume", "network-interface")
            ],
            update_default_version=True,
            tags=dict(args.tags),
            # A Capacity Block's reservation and market type (infra/interruptions.py); none elsewhere.
            **capacity_block_template(group),
            opts=child,
        )
        version = template.latest_version.apply(str)
        # Spot above an on-demand base over same-GPU types; else the one launch template.
        mixed = mixed_instances_policy(group, template.id, version)
        asg = aws.autoscaling.Group(
            f"{name}-asg",
            min_size=group.min_size,
            desired_capacity=group.desired_size if args.desired_size is None else args.desired_size,
            max_size=group.max_size,
            vpc_zone_identifiers=subnet_ids,
            launch_template=None if mixed else {"id": template.id, "version": version},
            mixed_instances_policy=mixed,
            capacity_rebalance=capacity_rebalance(group),
            placement_group=self.placement_group,
            target_group_arns=list(args.target_group_arns),
            # Serving hosts are replaced when the load balancer finds them dead, after a grace period long
            # enough for a first boot (driver check, image pull, weights download, warm-up).
            # A multi-node replica's hosts are healthy or not together (the ALB checks its leader's
            # runtime, which waits for every node): an ELB check would replace the survivors of a
            # replica that lost a node before its rendezvous re-forms them, so only EC2's counts.
            health_check_type="ELB" if args.target_group_arns and args.nodes_per_replica == 1 else "EC2",
            health_check_grace_period=min(MAX_GRACE_S, math.ceil(args.health_check_grace_s)),
            # ...but not before there is a release to serve (groups out of the target group check
            # only EC2 status, which an empty host passes). Until the first deploy a host continues
            # its launch hook empty and fails the load balancer's check (so it takes no traffic);
            # replacing it would launch another empty host every grace period. Suspending the
            # replacement (not the check) keeps the group's view honest (`Unhealthy`) and is undone
            # by the first deploy or rollback that succeeds (frontier/targets/ec2/backend.py), hence
            # ignored by later updates. Standby would not do: it needs desired capacity above
            # min_size and takes hosts out of the InService count `pulumi up` waits for.
            suspended_processes=[REPLACE_UNHEALTHY] if args.target_group_arns else None,
            # `pulumi up` fails when the GPUs never come (no capacity, hosts that ABANDON their launch),
            # instead of ending green with none: it waits as long as one launch hook may take.
            wait_for_capacity_timeout=f"{math.ceil(args.launch_timeout_s / 60) + 5}m",
            # Hooks on the group itself, so even the first hosts wait: a host is InService (and in the
            # target group) only once it serves the current release; scale-in drains a host first.
            initial_lifecycle_hooks=[
                {
                    "name": LAUNCH_HOOK,
                    "lifecycle_transition": "autoscaling:EC2_INSTANCE_LAUNCHING",
                    "default_result": "ABANDON",
                    "heartbeat_timeout": args.launch_timeout_s,
                },
                {
                    "name": TERMINATE_HOOK,
                    "lifecycle_transition": "autoscaling:EC2_INSTANCE_TERMINATING",
                    "default_result": "CONTINUE",
                    "heartbeat_timeout": args.terminate_timeout_s,
                },
            ],
            # A new AMI or launch template rolls through the fleet, each new host through the hooks.
            instance_refresh={"strategy": "Rolling", "preferences": dict(args.refresh or {})}
            if args.refresh
            else None,
            # A custom policy (a Lambda function) must come first; the others order what it returns.
            termination_policies=[
                *([ReplicaTermination(f"{name}-terminator", args.termination, child).function_arn] if args.termination else []),
                "OldestLaunchTemplate",
                "OldestInstance",
            ],
            enabled_metrics=[
                "GroupInServiceInstances",
                "GroupDesiredCapacity",
                "GroupPendingInstances",
                "GroupTerminatingInstances",
            ],
            tags=[
                {"key": key, "value": value, "propagate_at_launch": True} for key, value in host_tags.items()
            ],
            # The scaling policy and `fab scale` own the desired capacity once the group exists, and
            # `fab deploy` the suspended processes (AZRebalance while it runs, ReplaceUnhealthy above).
            opts=pulumi.ResourceOptions(
                parent=self,
                ignore_changes=["desiredCapacity", "suspendedProcesses"],
                depends_on=list(args.boot_dependencies),
            ),
        )
        scaled = ScaledGroup(asg.name, group, (args.stack, group.name), child)
        if args.nodes_per_replica > 1:
            whole_replicas(
                f"{name}-queue-depth", scaled, args.nodes_per_replica, warmup_s=args.instance_warmup_s
            )
        elif args.scale_on == "running_requests":
            # Each host held at ``scale_in_utilisation`` of its concurrency: the scale-in rule removes
            # a replica only when the rest would stay at or under the same share, so the two never
            # undo each other.
            target = args.max_concurrency * group.scale_in_utilisation
            self._track_per_host(f"{name}-running", asg.name, RUNNING_REQUESTS_METRIC, target, args, child)
        else:
            target = group.target_queue_depth
            self._track_per_host(f"{name}-queue-depth", asg.name, QUEUE_DEPTH_METRIC, target, args, child)
        if args.ttft_scale_out_ms is not None:
            scale_out_on_ttft(
                f"{name}-ttft",
                scaled,
                args.ttft_scale_out_ms,
                nodes=args.nodes_per_replica,
                warmup_s=args.instance_warmup_s,
            )
        # Out on its signal (above); in a replica at a time, only when a replica fewer would do.
        scale_in_by_load(
            f"{name}-load",
            asg.name,
            group,
            nodes=args.nodes_per_replica,
            max_concurrency=args.max_concurrency,
            dimensions=scaled.dimensions,
            opts=child,
        )
        if group.schedule is not None:
            scheduled_capacity(f"{name}-schedule", scaled)
        # From zero means one host: not a replica where it spans several (`fab scale` starts those).
        if group.min_size == 0 and group.idle_to_zero_s is not None and args.nodes_per_replica == 1:
            from_zero_and_back(f"{name}-zero", scaled)
        self.asg_name, self.asg_arn, self.launch_template_id = asg.name, asg.arn, template.id
        self.register_outputs({"asg_name": asg.name, "launch_template_id": template.id})

    @staticmethod
    def _track_per_host(
        name: str,
        asg_name: pulumi.Output[str],
        metric_name: str,
        target: float,
        args: NodeGroupArgs,
        opts: pulumi.ResourceOptions,
    ) -> None:
        """Target tracking of ``metric_name`` at ``target`` a host, scale-out only: tracking a queue
        that is empty at any steady load would take the group to min_size; infra/scale_in.py decides
        when hosts go."""
        group = args.group
        aws.autoscaling.Policy(
            name,
            autoscaling_group_name=asg_name,
            policy_type="TargetTrackingScaling",
            estimated_instance_warmup=args.instance_warmup_s,
            target_tracking_configuration={
                "disable_scale_in": True,
                "target_value": target,
                "customized_metric_specification": {
                    "namespace": CLOUDWATCH_NAMESPACE,
                    "metric_name": metric_name,
                    "metric_dimensions": [
                        {"name": key, "value": value}
                        for key, value in zip(CLOUDWATCH_DIMENSIONS, (args.stack, group.name), strict=True)
                    ],
                    # Every host publishes under the group's dimensions: the average is per host.
                    "statistic": "Average",
                },
            },
            opts=opts,
        )

    @staticmethod
    def _volume(device: str, size_gb: int, *, iops: int | None = None, throughput: int | None = None) -> dict:
        ebs = {
            "volume_type": "gp3",
            "volume_size": size_gb,
            "encrypted": "true",
            "delete_on_termination": "true",
        }
        if iops:
            ebs |= {"iops": iops, "throughput": throughput}
        return {"device_name": device, "ebs": ebs}


@dataclass(frozen=True)
class ScaledGroup:
    """A node group's auto scaling group, as the policies and alarms that scale it name it."""

    asg_name: pulumi.Input[str]
    group: NodeGroup
    #: The stack's and the group's name: what its hosts publish their figures under.
    dimensions: tuple[str, str]
    opts: pulumi.ResourceOptions


def whole_replicas(name: str, scaled: ScaledGroup, nodes: int, *, warmup_s: int) -> None:
    """Queue-depth scale-out of a group whose replica spans ``nodes`` hosts, a whole replica at a time.

    Target tracking sets any capacity it likes, and a group of 5 hosts at 2 per replica serves as
    2 replicas with a fifth host idle. Instead: a step policy adds ``nodes`` hosts when the average
    QueueDepth per host stays above ``target_queue_depth`` for 3 minutes. (A worker publishes its
    leader's queue, through its leader proxy, so the average per host is the average per replica.)
    Scale-in is :func:`infra.scale_in.scale_in_by_load`'s, by ``nodes`` hosts too, and which hosts
    go is the replica termination policy's (infra/replica_scaling.py).
    """
    queue = group_metric(QUEUE_DEPTH_METRIC, scaled.dimensions, statistic="Average")
    add_a_replica_above(name, scaled, queue, scaled.group.target_queue_depth, nodes=nodes, warmup_s=warmup_s)


def scale_out_on_ttft(
    name: str, scaled: ScaledGroup, threshold_ms: float, *, nodes: int, warmup_s: int
) -> None:
    """A latency signal beside the queue: a step policy adds one replica (``nodes`` hosts) when the
    group's TimeToFirstToken p90 stays above ``threshold_ms`` (the stack's ``slo.ttft_ms``) for 3
    minutes. Long prompts can slow first tokens while few requests wait, which the queue's target
    never sees. Hosts publish the runtime's TTFT histogram as values with counts, so the p90 is
    CloudWatch's own percentile over every request of the group, not an average of hosts' p90s.
    No traffic publishes no TTFT: missing data does not breach. Scale-in stays the load rule's."""
    p90 = group_metric(TTFT_CW_METRIC, scaled.dimensions, extended_statistic="p90")
    add_a_replica_above(name, scaled, p90, threshold_ms, nodes=nodes, warmup_s=warmup_s)


def group_metric(metric_name: str, dimensions: tuple[str, str], **statistic: str) -> dict[str, Any]:
    """A series the group's hosts publish (under the stack's and the group's name), as an alarm
    reads it: ``statistic`` (or ``extended_statistic``, a percentile) of each minute."""
    return {
        "namespace": CLOUDWATCH_NAMESPACE,
        "metric_name": metric_name,
        "dimensions": dict(zip(CLOUDWATCH_DIMENSIONS, dimensions, strict=True)),
        **statistic,
    }


def add_a_replica_above(
    name: str, scaled: ScaledGroup, metric: dict[str, Any], threshold: float, *, nodes: int, warmup_s: int
) -> None:
    """A step policy that adds a replica (``nodes`` hosts), and the alarm that runs it: ``metric``
    above ``threshold`` for 3 minutes in a row. Missing data (no traffic) does not breach."""
    step_on_alarm(
        f"{name}-out",
        scaled.asg_name,
        "ChangeInCapacity",
        nodes,
        opts=scaled.opts,
        warmup_s=warmup_s,
        comparison_operator="GreaterThanThreshold",
        threshold=threshold,
        evaluation_periods=3,
        datapoints_to_alarm=3,
        period=60,
        **metric,
    )


def from_zero_and_back(name: str, scaled: ScaledGroup) -> None:
    """A group that may reach zero (``min_size: 0``): the queue-depth policy cannot start it (no host
    publishes a queue), so an alarm on the requests the gateway holds for it — while nothing serves —
    sets the desired capacity to 1; another, on nothing running or held for ``idle_to_zero_s``,
    sets it to 0. Both are step policies with an exact capacity, so neither fights the target
    tracking above one host."""
    held = group_metric(HELD_REQUESTS_CW_METRIC, scaled.dimensions)
    running = group_metric(RUNNING_REQUESTS_METRIC, scaled.dimensions)
    serving = {
        "namespace": "AWS/AutoScaling",
        "metric_name": "GroupInServiceInstances",
        "dimensions": {"AutoScalingGroupName": scaled.asg_name},
    }

    def queries(expression: str) -> list[dict]:
        return [
            {"id": "held", "metric": {**held, "period": 60, "stat": "Maximum"}},
            {"id": "running", "metric": {**running, "period": 60, "stat": "Sum"}},
            {"id": "serving", "metric": {**serving, "period": 60, "stat": "Maximum"}},
            {"id": "signal", "expression": expression, "return_data": True},
        ]

    for action, capacity, expression, periods in (
        ("launch", 1, "IF(FILL(held, 0) > 0 AND FILL(serving, 0) == 0, 1, 0)", 1),
        (
            "idle",
            0,
            "IF(FILL(held, 0) + FILL(running, 0) == 0 AND FILL(serving, 0) > 0, 1, 0)",
            max(1, math.ceil((scaled.group.idle_to_zero_s or 0) / 60)),
        ),
    ):
        step_on_alarm(
            f"{name}-{action}",
            scaled.asg_name,
            "ExactCapacity",
            capacity,
            opts=scaled.opts,
            comparison_operator="GreaterThanOrEqualToThreshold",
            threshold=1,
            evaluation_periods=periods,
            datapoints_to_alarm=periods,
            metric_queries=queries(expression),
        )


def scheduled_capacity(name: str, scaled: ScaledGroup) -> None:
    """The group's schedule on its auto scaling group: each window raises the floor at its start and
    gives the group's own back at its end (scheduled actions, in the schedule's time zone); a
    forecast is a predictive scaling policy on the requests the group's hosts publish."""
    group, asg_name, opts = scaled.group, scaled.asg_name, scaled.opts
    schedule = group.schedule
    assert schedule is not None
    for window in schedule.windows:
        # Only the floor moves: the desired capacity follows (it is raised to a new min_size), and
        # the queue-depth policy keeps scaling above it. -1 leaves a field as it is.
        for edge, at, floor in (
            ("start", window.start, window.min_size),
            ("end", window.end, group.min_size),
        ):
            aws.autoscaling.Schedule(
                f"{name}-{window.name}-{edge}",
                scheduled_action_name=f"{window.name}-{edge}",
                autoscaling_group_name=asg_name,
                recurrence=cron_of(window, at),
                time_zone=schedule.timezone,
                min_size=floor,
                max_size=-1,
                desired_capacity=-1,
                opts=opts,
            )
    if schedule.forecast is None:
        return
    metric = {
        "namespace": CLOUDWATCH_NAMESPACE,
        "metric_name": RUNNING_REQUESTS_METRIC,
        "dimensions": [
            {"name": k, "value": v} for k, v in zip(CLOUDWATCH_DIMENSIONS, scaled.dimensions, strict=True)
        ],
    }
    aws.autoscaling.Policy(
        f"{name}-forecast",
        autoscaling_group_name=asg_name,
        policy_type="PredictiveScaling",
        predictive_scaling_configuration={
            "mode": "ForecastAndScale",
            # Hosts are launched this long before the forecast says the load arrives.
            "scheduling_buffer_time": str(schedule.forecast.lead_s),
            "metric_specification": {
                "target_value": schedule.forecast.per_host_load,
                "customized_load_metric_specification": {
                    "metric_data_queries": [{"id": "load", "metric_stat": {"metric": metric, "stat": "Sum"}}]
                },
                "customized_scaling_metric_specification": {
                    "metric_data_queries": [
                        {"id": "per_host", "metric_stat": {"metric": metric, "stat": "Average"}}
                    ]
                },
            },
        },
        opts=opts,
    )
