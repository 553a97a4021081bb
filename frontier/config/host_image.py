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

The gateway's hosts (``gateway:`` on EC2) follow the same rule with a list of their own
(:func:`gateway_needs`): the AWS CLI, the CloudWatch agent, openssl and a Python virtual
environment holding exactly the gateway's locked dependencies (``requirements/gateway.txt``),
stamped with the lock's digest. They are baked by the same ``fab ami.bake`` as a role of its own
(``--group gateway``, pinned in ``gateway.ami_id``), not into the runtime hosts' image: a gateway
host runs no docker, driver or HAProxy, and a runtime host no gateway. What a gateway host still
fetches at boot is the stack's own: the two wheels and ``gateway.yaml`` that ``fab gateway.publish``
puts in the history bucket (S3, reached through the VPC's endpoint), installed from those files
with no index and no dependencies, so a publish still reaches new hosts without a bake, while a
change of the locked set needs one (the stamp no longer matches, and the preflight says so).
"""

from __future__ import annotations

import hashlib
import re
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
    GATEWAY = "gateway hosts"


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


# --- the gateway's hosts ---------------------------------------------------------------------------

#: ``fab ami.bake --group gateway``: the gateway's hosts, where no node group is named so.
GATEWAY_IMAGE = "gateway"
#: In the gateway's virtual environment: the digest of the locked set it was made from.
LOCK_STAMP = "frontier-lock.sha256"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+)")


@dataclass(frozen=True)
class LockedSet:
    """The distributions a lock file pins (``name==version``, in its order) and their digest."""

    pins: tuple[str, ...]
    digest: str


def locked_set(lock_text: str) -> LockedSet:
    """The pins of a pip-compile lock (its hashes and comments left out: a bake's user data holds
    16 KiB, the hashes alone more than that)."""
    pins = tuple(m.group(1) for line in lock_text.splitlines() if (m := _PIN.match(line)))
    if not pins:
        raise ValueError("the lock pins no distribution (no 'name==version' line)")
    digest = "sha256:" + hashlib.sha256("\n".join(pins).encode()).hexdigest()
    return LockedSet(pins, digest)


def gateway_needs(venv: str, lock: LockedSet) -> tuple[HostTool, ...]:
    """What a gateway host runs, in the order its boot first uses it: the virtual environment at
    ``venv`` made from ``lock`` (its stamp matching, its requirements consistent), openssl, the AWS
    CLI and the CloudWatch agent."""
    lock_file = "/tmp/frontier-gateway-lock.txt"
    shared = {tool.name: tool for tool in TOOLS}
    return (
        HostTool(
            "gateway-venv",
            f'[ "$(cat {venv}/{LOCK_STAMP} 2>/dev/null)" = {lock.digest} ] '
            f"&& {venv}/bin/python -m pip check >/dev/null 2>&1",
            Needed.GATEWAY,
            "the gateway's Python and its locked dependencies (requirements/gateway.txt)",
            (
                "apt-get install -y -qq python3-venv",
                f"python3 -m venv --clear {venv}",
                f"printf '%s\\n' {' '.join(lock.pins)} > {lock_file}",
                f"{venv}/bin/pip install --quiet --no-deps --no-cache-dir -r {lock_file}",
                f"echo {lock.digest} > {venv}/{LOCK_STAMP}",
            ),
        ),
        HostTool(
            "openssl",
            "command -v openssl >/dev/null",
            Needed.GATEWAY,
            "the gateway's TLS certificate is made at first boot",
            ("apt-get install -y -qq openssl",),
        ),
        shared["aws-cli-v2"],
        shared["amazon-cloudwatch-agent"],
    )
