"""GPU node groups: a launch template and an auto scaling group per ``node_groups[]`` entry.

Hosts boot the AWS Deep Learning Base AMI (Ubuntu 22.04, NVIDIA driver and container toolkit
preinstalled; ``fab drivers`` pins the branch) found by its public SSM parameter, with IMDSv2
required, encrypted gp3 root and model-cache volumes, no public address, and the cloud-init user data
rendered by :func:`frontier.render.files.render_cloud_init`. The ASG spreads hosts over the private subnets;
a group that needs EFA (``efa: true``, or a model sharded across nodes) gets a cluster placement
group in one AZ instead, as EFA requires.

``fab`` finds hosts by these tags on every instance: ``frontier:stack``, ``frontier:node-group`` and
``frontier:role = runtime``.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from frontier.config.schema import NodeGroup, Settings
from frontier.contracts import CACHE_DEVICE_NAME
from infra.errors import ProvisionError
from infra.tags import NODE_GROUP_TAG, ROLE_TAG, RUNTIME_ROLE

# Published by AWS for the Deep Learning AMIs; "latest" follows their monthly patch releases.
GPU_AMI_PARAMETER = (
    "/aws/service/deeplearning/ami/{arch}/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
)
CPU_AMI_PARAMETER = "/aws/service/canonical/ubuntu/server/22.04/stable/current/{arch}/hvm/ebs-gp2/ami-id"
# Graviton families (g5g) and Grace-Blackwell (p6e-gb200) are arm64; everything else here is x86_64.
ARM_FAMILIES = ("g5g", "p6e-gb", "c7g", "m7g", "r7g", "c8g", "m8g")
# Fast volume for weights: loading a 140 GB model at 1000 MiB/s takes ~2.5 min instead of ~19 at gp3's default.
CACHE_IOPS = 4000
CACHE_THROUGHPUT_MIBPS = 1000
# Containers on the host (the runtime runs in one) are one network hop further from IMDS.
METADATA_HOP_LIMIT = 2
MAX_GRACE_S = 7200


def architecture(instance_type: str) -> str:
    family = instance_type.split(".", 1)[0]
    return "arm64" if family.startswith(ARM_FAMILIES) else "x86_64"


def needs_efa(settings: Settings, group: NodeGroup) -> bool:
    """EFA when asked for, or when one replica's GPUs (TP x PP) do not fit on one node."""
    gpus_per_replica = settings.runtime.tensor_parallel_size * settings.runtime.pipeline_parallel_size
    return group.efa or gpus_per_replica > group.gpus_per_node


@dataclass(frozen=True)
class MachineImage:
    image_id: str
    root_device_name: str
    root_snapshot_gb: int


def look_up_image(group: NodeGroup) -> MachineImage:
    """The AMI from its SSM parameter, then its root device name (the root volume mapping must match it)."""
    arch = architecture(group.instance_type)
    if group.accelerator == "gpu":
        parameter = GPU_AMI_PARAMETER.format(arch=arch)
    else:
        parameter = CPU_AMI_PARAMETER.format(arch="arm64" if arch == "arm64" else "amd64")
    image_id = aws.ssm.get_parameter(name=parameter).value
    image = aws.ec2.get_ami(
        owners=["amazon", "099720109477"],  # AWS (Deep Learning AMIs) and Canonical
        filters=[aws.ec2.GetAmiFilterArgs(name="image-id", values=[image_id])],
    )
    if image.architecture != arch:
        raise ProvisionError(
            f"node_groups[{group.name}].instance_type = {group.instance_type!r}: is {arch}, but the AMI "
            f"{image_id} from {parameter} is {image.architecture}"
        )
    root = next((m for m in image.block_device_mappings if m.device_name == image.root_device_name), None)
    root_gb = int((root.ebs or {}).get("volume_size") or 0) if root else 0
    return MachineImage(image_id=image_id, root_device_name=image.root_device_name, root_snapshot_gb=root_gb)


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
            block_device_mappings=[
                self._volume(args.image.root_device_name, group.root_volume_gb),
                self._volume(
                    CACHE_DEVICE_NAME,
                    group.cache_volume_gb,
                    iops=CACHE_IOPS,
                    throughput=CACHE_THROUGHPUT_MIBPS,
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
            opts=child,
        )
        asg = aws.autoscaling.Group(
            f"{name}-asg",
            min_size=group.min_size,
            desired_capacity=group.desired_size,
            max_size=group.max_size,
            vpc_zone_identifiers=subnet_ids,
            launch_template={"id": template.id, "version": template.latest_version.apply(str)},
            placement_group=self.placement_group,
            target_group_arns=list(args.target_group_arns),
            # Serving hosts are replaced when the load balancer finds them dead, after a grace period long
            # enough for a first boot (driver check, image pull, weights download, warm-up).
            health_check_type="ELB" if args.target_group_arns else "EC2",
            health_check_grace_period=min(MAX_GRACE_S, math.ceil(args.health_check_grace_s)),
            # GPU capacity can take long to appear; `pulumi up` must not hang on it. `fab status` shows it.
            wait_for_capacity_timeout="0",
            termination_policies=["OldestLaunchTemplate", "OldestInstance"],
            enabled_metrics=[
                "GroupInServiceInstances",
                "GroupDesiredCapacity",
                "GroupPendingInstances",
                "GroupTerminatingInstances",
            ],
            tags=[
                {"key": key, "value": value, "propagate_at_launch": True} for key, value in host_tags.items()
            ],
            opts=child,
        )
        self.asg_name, self.asg_arn, self.launch_template_id = asg.name, asg.arn, template.id
        self.register_outputs({"asg_name": asg.name, "launch_template_id": template.id})

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
