"""What a runtime host's machine image must carry before its first boot, and how to tell.

A host boots with ``network.egress: endpoints`` by default: it reaches AWS through the VPC's
endpoints and nothing else, so no package mirror, no snap store, no vendor download. Whatever the
bootstrap runs must therefore already be on the image. The stock images (AWS's Deep Learning AMI,
Canonical's Ubuntu) lack some of it — HAProxy (the TLS proxy every EC2 host terminates the load
balancer's HTTPS in) and the ECR credential helper among them — so a production stack runs an image
baked by ``fab ami.bake``, which installs :data:`TOOLS` and tags the AMI with what it carries
(:data:`CONTENTS_TAG`).

The list is declared once here and read three ways:

* the bootstrap's preflight (rendered into cloud-init) checks each needed tool first thing and, on a
  closed network, stops within seconds with one line naming what is missing and the bake command,
  instead of failing half-way and being relaunched by the group until ``pulumi up`` times out;
* the Pulumi program refuses, before any instance launches, a node group whose pinned AMI does not
  carry (by its tag) what the group needs when the stack's egress reaches no mirror;
* ``fab ami.bake`` installs exactly these, and runs the same preflight on the result before it images.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from frontier.config.schema import NodeGroup

CONTENTS_TAG = "frontier:host-tools"
# The S3 conditional write the multi-node rendezvous makes (`aws s3api put-object --if-match`)
# arrived in AWS CLI v2.22; the distributions' packaged v1 cannot do it.
AWS_CLI_MIN = (2, 22)


class Needed(Enum):
    """Which hosts need a tool."""

    EVERY_HOST = "every host"
    GPU = "GPU hosts"
    EFA = "hosts with EFA"


@dataclass(frozen=True)
class HostTool:
    """One thing the image carries: the name an operator knows it by, how a shell tells it is there."""

    name: str
    #: A shell condition, true where the tool is present (and recent enough).
    present: str
    needed: Needed
    why: str
    #: The bake's shell lines that install it on an Ubuntu image with a route to the internet.
    install: tuple[str, ...]


TOOLS: tuple[HostTool, ...] = (
    HostTool(
        "docker",
        "command -v docker >/dev/null",
        Needed.EVERY_HOST,
        "the runtime unit runs the release's image with docker",
        ("apt-get install -y -qq docker.io",),
    ),
    HostTool(
        "aws-cli-v2",
        "frontier_aws_cli_at_least",
        Needed.EVERY_HOST,
        "the bootstrap fetches the host tools and releases with it; the rendezvous needs --if-match (v2.22+)",
        (
            'curl -fsSL "https://awscli.amazonaws.com/awscli-exe-linux-$(uname -m).zip" -o /tmp/awscliv2.zip',
            "(cd /tmp && unzip -q -o awscliv2.zip && ./aws/install --update)",
        ),
    ),
    HostTool(
        "haproxy",
        "command -v haproxy >/dev/null",
        Needed.EVERY_HOST,
        "the load balancer's HTTPS ends in HAProxy on the target port (and a worker node's leader proxy)",
        ("apt-get install -y -qq haproxy", "systemctl disable haproxy.service"),
    ),
    HostTool(
        "amazon-ecr-credential-helper",
        "command -v docker-credential-ecr-login >/dev/null",
        Needed.EVERY_HOST,
        "docker pulls the runtime image from ECR with the instance profile's credentials",
        ("apt-get install -y -qq amazon-ecr-credential-helper",),
    ),
    HostTool(
        "amazon-cloudwatch-agent",
        "[ -x /opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl ]",
        Needed.EVERY_HOST,
        "ships the runtime's and the bootstrap's logs",
        (
            'curl -fsSL -o /tmp/cwagent.deb "https://amazoncloudwatch-agent.s3.amazonaws.com/ubuntu/'
            '$(dpkg --print-architecture)/latest/amazon-cloudwatch-agent.deb"',
            "dpkg -i -E /tmp/cwagent.deb",
        ),
    ),
    HostTool(
        "nvidia-driver",
        "command -v nvidia-smi >/dev/null",
        Needed.GPU,
        "the GPU driver of drivers.driver_branch (install-nvidia.sh checks the branch at boot)",
        ("apt-get install -y -qq nvidia-driver-${DRIVER_BRANCH}-server-open",),
    ),
    HostTool(
        "nvidia-container-toolkit",
        "command -v nvidia-ctk >/dev/null",
        Needed.GPU,
        "gives the runtime's container its GPUs",
        ("apt-get install -y -qq nvidia-container-toolkit=${TOOLKIT_VERSION}-1",),
    ),
    HostTool(
        "dcgm",
        "command -v dcgmi >/dev/null",
        Needed.GPU,
        "GPU health and metrics (the CloudWatch agent's nvidia_gpu plugin beside it)",
        ("apt-get install -y -qq datacenter-gpu-manager",),
    ),
    HostTool(
        "efa",
        "[ -x /opt/amazon/efa/bin/fi_info ] && [ -d /opt/amazon/ofi-nccl ]",
        Needed.EFA,
        "libfabric and aws-ofi-nccl: NCCL over EFA between nodes",
        (
            "curl -fsSL https://efa-installer.amazonaws.com/aws-efa-installer-latest.tar.gz | tar -xz -C /tmp",
            "(cd /tmp/aws-efa-installer && ./efa_installer.sh -y --skip-kmod-check)",
        ),
    ),
)


def needs(group: NodeGroup, *, multi_node: bool) -> tuple[HostTool, ...]:
    """The tools a host of ``group`` runs, in the order the bootstrap first uses them."""
    wanted = {Needed.EVERY_HOST}
    if group.accelerator == "gpu":
        wanted.add(Needed.GPU)
    # The nodes of one replica talk over EFA whether or not the group asks for it (infra.nodes.needs_efa).
    if group.efa or multi_node:
        wanted.add(Needed.EFA)
    return tuple(tool for tool in TOOLS if tool.needed in wanted)


def contents_value(tools: tuple[HostTool, ...]) -> str:
    """The AMI tag's value: the names of what the bake installed, sorted (a tag holds 256 characters)."""
    return ",".join(sorted(tool.name for tool in tools))


def missing_from(tag_value: str | None, tools: tuple[HostTool, ...]) -> list[str]:
    """Which of ``tools`` an image tagged ``tag_value`` does not carry (all of them: no tag)."""
    carried = set((tag_value or "").split(","))
    return [tool.name for tool in tools if tool.name not in carried]


def bake_command(stack: str, group: str) -> str:
    return f"fab ami.bake -s {stack} --group {group}"
