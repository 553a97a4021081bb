"""``ami.latest`` and ``ami.bake``: the stock image a node group could start from, and the image it runs.

A host on a closed network (``network.egress: endpoints``) installs nothing at boot, so its group
pins an image baked for it (:mod:`frontier.config.host_image` lists what that carries). ``ami.latest``
says which stock image is newest; ``ami.bake`` makes a host image from it and prints the stack-file
line to pin it. The bake starts and images EC2 instances: run it as the account's administrator
(the principal ``pulumi up`` runs as), not with the deploy role.
"""

from __future__ import annotations

from invoke import Collection, task
from invoke.exceptions import Exit

from frontier.cli import tables
from frontier.cli.common import reports_errors, settings_for
from frontier.errors import FrontierError
from frontier.render.boot import image_role
from frontier.targets import backend_for
from frontier.targets.ec2.ami import latest_amis
from frontier.targets.ec2.bake import BakeError, BakeRequest, bake

STACK = "stack name (default $FRONTIER_STACK, else local)"


@task(name="latest", help={"stack": STACK})
@reports_errors
def ami_latest(c, stack=None):
    """Propose the newest published AMI for each node group against the one the stack pins."""
    settings = settings_for(stack)
    proposals = latest_amis(settings, backend_for(settings).aws_client("ssm"))
    rows = [(p.group, p.pinned or "-", p.latest, p.action()) for p in proposals]
    console = tables.console()
    console.print(
        tables.table(f"AMIs of stack {settings.stack}", ("node group", "pinned", "latest", "action"), rows)
    )
    stale = [p for p in proposals if not p.current]
    if stale and settings.network.egress == "endpoints":
        # A stock image cannot boot a host that installs nothing: it is the bake's source, not the pin.
        console.print(
            "network.egress is endpoints: bake each from its newest stock image, then pin the result:"
        )
        for p in stale:
            console.print(
                f"  fab ami.bake -s {settings.stack} --group {p.group} --subnet SUBNET --source {p.latest}"
            )
    elif stale:
        console.print(f"edit {settings.source}:")
        for p in stale:
            console.print(f"  {p.field}: {p.pinned or '(empty)'} -> {p.latest}")


@task(
    name="bake",
    help={
        "stack": STACK,
        "group": "the node group whose hosts the image is for, or 'gateway' for the gateway's hosts "
        "(default: the stack's only node group, where it has no gateway)",
        "subnet": "a subnet that reaches the internet, where the builder instance runs (required)",
        "source": "the stock image to start from (default: the newest `fab ami.latest` reads)",
        "instance_type": "the builder's instance type (default: c7i.2xlarge, c7g.2xlarge on Graviton)",
        "timeout_s": "how long the builder may take (default 3600)",
    },
)
@reports_errors
def ami_bake(c, stack=None, group=None, subnet=None, source=None, instance_type=None, timeout_s=None):
    """Bake an image carrying what the group's hosts run, and print the stack-file line that pins it."""
    settings = settings_for(stack)
    try:
        role = image_role(settings, group)
    except FrontierError as exc:
        asked = "no --group" if group is None else f"--group {group!r}"
        raise Exit(f"error: {asked}: {exc}", code=2) from None
    if not subnet:
        raise Exit(
            "error: --subnet: a subnet whose instances reach the internet (the bake installs packages "
            "from their mirrors); a public subnet of the stack's VPC will do",
            code=2,
        )
    timeout = _positive("--timeout-s", timeout_s, 3600)
    backend = backend_for(settings)
    console = tables.console()
    request = BakeRequest(settings, role, subnet, source or "", instance_type or "", timeout)
    try:
        baked = bake(backend.aws_client("ec2"), backend.aws_client("ssm"), request, say=console.print)
    except BakeError as exc:
        raise Exit(f"error: {exc}", code=1) from None
    console.print(
        f"baked {baked.image_id} from {baked.source_image} in {baked.seconds / 60:.0f} min: {baked.contents}"
    )
    console.print(f"edit {settings.source}:\n  {baked.field}: {role.pinned or '(empty)'} -> {baked.image_id}")


def _positive(option: str, value: str | None, default: float) -> float:
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1
    if seconds <= 0:
        raise Exit(f"error: {option} {value!r}: must be a positive number of seconds", code=2)
    return seconds


def register(namespace: Collection) -> None:
    namespace.add_collection(Collection("ami", ami_latest, ami_bake))
