"""What a node group's EC2 instance type has besides its GPUs: instance-store disks and NVSwitch.

Both decide how a host is set up: instance-store NVMe holds the model cache (RAID 0) instead of an
EBS volume, and GPUs joined by NVSwitch need NVIDIA's fabric manager running before CUDA starts.
Sources: the EC2 instance type pages (accelerated computing, "Instance storage" column).
"""

from __future__ import annotations

from collections.abc import Iterable

from frontier.config.schema import NodeGroup, Runtime

# Instance type -> (NVMe instance-store disks, GB each).
INSTANCE_STORE: dict[str, tuple[int, int]] = {
    "g5.xlarge": (1, 250),
    "g5.2xlarge": (1, 450),
    "g5.12xlarge": (1, 3800),
    "g5.48xlarge": (2, 3800),
    "g6.xlarge": (1, 250),
    "g6.12xlarge": (4, 940),
    "g6e.xlarge": (1, 250),
    "g6e.12xlarge": (2, 1900),
    "g6e.48xlarge": (4, 1900),
    "p4d.24xlarge": (8, 1000),
    "p4de.24xlarge": (8, 1000),
    "p5.48xlarge": (8, 3840),
    "p5e.48xlarge": (8, 3840),
    "p5en.48xlarge": (8, 3840),
}

# Families whose GPUs talk through NVSwitch (SXM boards): fabric manager must run, at the
# driver's exact version.
NVSWITCH_FAMILIES = ("p4d", "p5", "p6")


def instance_store(instance_type: str) -> tuple[int, int]:
    """(disks, GB each) of the type's NVMe instance store; (0, 0) where it has none or is unknown."""
    return INSTANCE_STORE.get(instance_type, (0, 0))


def has_nvswitch(instance_type: str) -> bool:
    # p4de, p5e, p5en, p6-b200 ... share their family's prefix.
    return instance_type.split(".", 1)[0].startswith(NVSWITCH_FAMILIES)


# Published by AWS for the Deep Learning AMIs; "latest" follows their monthly patch releases.
# Read by `fab ami.latest` to propose a new pin, never by `pulumi up`.
GPU_AMI_PARAMETER = (
    "/aws/service/deeplearning/ami/{arch}/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
)
CPU_AMI_PARAMETER = "/aws/service/canonical/ubuntu/server/22.04/stable/current/{arch}/hvm/ebs-gp2/ami-id"
# Graviton families (g5g) and Grace-Blackwell (p6e-gb200) are arm64; everything else here is x86_64.
ARM_FAMILIES = ("g5g", "p6e-gb", "c7g", "m7g", "r7g", "c8g", "m8g")


def architecture(instance_type: str) -> str:
    family = instance_type.split(".", 1)[0]
    return "arm64" if family.startswith(ARM_FAMILIES) else "x86_64"


def ami_parameter(group: NodeGroup) -> str:
    """The public SSM parameter holding the newest AMI for the group's accelerator and architecture."""
    arch = architecture(group.instance_type)
    if group.accelerator == "gpu":
        return GPU_AMI_PARAMETER.format(arch=arch)
    return CPU_AMI_PARAMETER.format(arch="arm64" if arch == "arm64" else "amd64")


def uses_efa(group: NodeGroup, runtimes: Iterable[Runtime]) -> bool:
    """EFA when the group asks for it, or when a replica of a pool it runs (``runtimes``) does not fit
    on one node: its GPUs (TP x PP) outnumber the node's, or it spans several nodes.

    With EFA the runtime hosts' security group admits all traffic from itself (infra.security_groups):
    that also opens what the nodes of one replica need of each other, the step and store ports
    (names.REPLICA_STEP_PORT, REPLICA_STORE_PORT), the ephemeral ports gloo and NCCL open between
    every pair of ranks, and a worker's leader proxy to its leader's runtime port. Nothing else
    opens: the rule names the group itself, never an address range. The runtime's container gets
    the group's EFA devices (frontier.render.host).
    """
    return group.efa or any(
        rt.tensor_parallel_size * rt.pipeline_parallel_size > group.gpus_per_node or rt.nodes_per_replica > 1
        for rt in runtimes
    )
