"""``ami.bake``: a host image that carries everything its hosts run, made from a stock one.

Hosts boot on a network that reaches no package mirror (``network.egress: endpoints``), so what
they run must be on the image (:mod:`frontier.config.host_image`). The bake is plain EC2, driven from the
operator's machine, with no service of its own to provision:

1. a builder instance starts from the role's stock image (the newest the SSM parameter of
   ``fab ami.latest`` publishes, or ``--source``) in a subnet that reaches the internet, with the
   rendered ``templates/bake-host-image.sh.j2`` as its user data;
2. the script installs each missing tool, runs the hosts' own preflight over the result, writes
   ``frontier-bake: ok <tools>`` (or ``failed: ...``) to the console and powers off;
3. once stopped, its console says how it went; on success the builder is imaged, the image tagged
   with what it carries (``frontier:host-tools``, which ``pulumi up`` checks) and its source;
4. the builder is terminated whatever happened, and the stack-file line to change is printed.

One sequence for every role an image is baked for (:class:`frontier.render.boot.ImageRole`): a node
group's runtime hosts (``--group <name>``, pinned in ``node_groups[i].ami_id``) and the gateway's
hosts (``--group gateway``, pinned in ``gateway.ami_id``): a gateway image of its own, from the
stock Ubuntu image, rather than a role inside the runtime's image, as the two share no more than
the AWS CLI and the CloudWatch agent, and a runtime image is a GPU image (the Deep Learning AMI).

Why not EC2 Image Builder: a pipeline, recipe, component and infrastructure configuration per
group to provision and keep in step with the stack, for what one instance and one image call do;
and this sequence is the same one a person would follow by hand, which makes its failures legible.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError
from frontier_hostside.names import STACK_TAG

from frontier.config import host_image as image
from frontier.config.hardware import architecture
from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.render.boot import ImageRole, render_bake_script

BAKE_MARKER = "frontier-bake: "
# Builders sized for the driver's DKMS build, not for serving: no GPU is needed to install a driver.
BUILDER_TYPES = {"x86_64": "c7i.2xlarge", "arm64": "c7g.2xlarge"}
SOURCE_TAG = "frontier:source-image"


class BakeError(FrontierError):
    """The bake could not make an image; the builder is gone."""


@dataclass(frozen=True)
class BakeRequest:
    settings: Settings
    role: ImageRole
    subnet_id: str
    source_image: str = ""  # empty: the role's published stock image
    instance_type: str = ""  # empty: BUILDER_TYPES by the role's architecture
    timeout_s: float = 3600
    poll_s: float = 15


@dataclass(frozen=True)
class Baked:
    image_id: str
    source_image: str
    contents: str
    field: str
    builder: str
    seconds: float


Say = Callable[[str], None]


def bake(
    ec2: Any,
    ssm: Any,
    request: BakeRequest,
    say: Say = lambda _: None,
    console: Callable[[Any, str], str] | None = None,
) -> Baked:
    """Make the image (the module docstring's four steps); ``console`` reads a builder's console."""
    read_console = console or _console
    started = time.monotonic()
    settings, role = request.settings, request.role
    source = request.source_image or _published_image(ssm, role)
    script = render_bake_script(settings, role, source)
    contents = image.contents_value(role.tools)
    builder = _launch_builder(ec2, request, source, script)
    say(f"builder {builder} started from {source} in {request.subnet_id}: installing {contents}")
    try:
        _wait_stopped(ec2, builder, request, say, read_console)
        verdict = bake_verdict(read_console(ec2, builder))
        if verdict != f"ok {contents}":
            raise BakeError(f"the builder {builder} did not finish the bake: {verdict}")
        image_id = _image(ec2, request, builder, source, contents)
        say(f"image {image_id} of {builder}: waiting until it is available")
        ec2.get_waiter("image_available").wait(
            ImageIds=[image_id],
            WaiterConfig={"Delay": max(request.poll_s, 1), "MaxAttempts": _attempts(request)},
        )
    finally:
        ec2.terminate_instances(InstanceIds=[builder])
        say(f"builder {builder} terminated")
    return Baked(image_id, source, contents, role.field, builder, time.monotonic() - started)


def bake_verdict(console: str) -> str:
    """The builder's last word on its console: ``ok <tools>``, ``failed: <why>``, or what is missing."""
    said = [line.split(BAKE_MARKER, 1)[1].strip() for line in console.splitlines() if BAKE_MARKER in line]
    verdicts = [line for line in said if line.startswith(("ok ", "failed:"))]
    if verdicts:
        return verdicts[-1]
    return "its console holds no verdict" + (f" (last: {said[-1]})" if said else "")


def _published_image(ssm: Any, role: ImageRole) -> str:
    parameter = role.stock_parameter
    try:
        return str(ssm.get_parameter(Name=parameter)["Parameter"]["Value"])
    except ClientError as exc:
        raise BakeError(f"cannot read the stock image of {role.name} from {parameter}: {exc}") from None


def _launch_builder(ec2: Any, request: BakeRequest, source: str, script: str) -> str:
    role, stack = request.role, request.settings.stack
    tags = [
        {"Key": "Name", "Value": f"frontier-{stack}-{role.name}-bake"},
        {"Key": STACK_TAG, "Value": stack},
        {"Key": SOURCE_TAG, "Value": source},
    ]
    try:
        reply = ec2.run_instances(
            ImageId=source,
            InstanceType=request.instance_type or BUILDER_TYPES[architecture(role.instance_type)],
            MinCount=1,
            MaxCount=1,
            UserData=script,
            # The script's poweroff stops the builder, so its disk can be imaged as it is.
            InstanceInitiatedShutdownBehavior="stop",
            MetadataOptions={"HttpTokens": "required"},
            NetworkInterfaces=[
                {"DeviceIndex": 0, "SubnetId": request.subnet_id, "AssociatePublicIpAddress": True}
            ],
            BlockDeviceMappings=[
                {
                    "DeviceName": _root_device(ec2, source),
                    "Ebs": {"VolumeSize": role.root_volume_gb, "VolumeType": "gp3", "Encrypted": True},
                }
            ],
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )
    except ClientError as exc:
        raise BakeError(f"cannot start a builder from {source} in {request.subnet_id}: {exc}") from None
    return str(reply["Instances"][0]["InstanceId"])


def _root_device(ec2: Any, source: str) -> str:
    [described] = ec2.describe_images(ImageIds=[source])["Images"]
    return str(described.get("RootDeviceName") or "/dev/sda1")


def _wait_stopped(
    ec2: Any, builder: str, request: BakeRequest, say: Say, console: Callable[[Any, str], str]
) -> None:
    deadline = time.monotonic() + request.timeout_s
    while True:
        [reservation] = ec2.describe_instances(InstanceIds=[builder])["Reservations"]
        state = reservation["Instances"][0]["State"]["Name"]
        if state == "stopped":
            return
        if state in ("terminated", "shutting-down"):
            raise BakeError(f"the builder {builder} is {state} before it finished")
        if time.monotonic() > deadline:
            raise BakeError(
                f"the builder {builder} still {state} after {request.timeout_s:g} s: "
                f"{bake_verdict(console(ec2, builder))}"
            )
        say(f"builder {builder}: {state}")
        time.sleep(request.poll_s)


def _console(ec2: Any, builder: str) -> str:
    # botocore decodes the console's base64 itself (its GetConsoleOutput handler).
    return str(ec2.get_console_output(InstanceId=builder, Latest=True).get("Output") or "")


def _image(ec2: Any, request: BakeRequest, builder: str, source: str, contents: str) -> str:
    stack, role = request.settings.stack, request.role
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    reply = ec2.create_image(
        InstanceId=builder,
        Name=f"frontier-{stack}-{role.name}-{stamp}",
        Description=f"Frontier {stack} {role.name}: {contents} on {source}",
        TagSpecifications=[
            {
                "ResourceType": "image",
                "Tags": [
                    {"Key": image.CONTENTS_TAG, "Value": contents},
                    {"Key": STACK_TAG, "Value": stack},
                    {"Key": SOURCE_TAG, "Value": source},
                ],
            }
        ],
    )
    return str(reply["ImageId"])


def _attempts(request: BakeRequest) -> int:
    return max(1, int(request.timeout_s / max(request.poll_s, 1)))
