"""EC2: hosts found by their tags, reached over SSH, drained through the ALB target group.

Bucket names, the target group and the endpoint come from the Pulumi stack outputs saved under
``.frontier/outputs/<stack>.json`` (:class:`frontier.config.outputs.Ec2Outputs`, see :mod:`frontier.aws`).

The node group is an auto scaling group (:class:`~frontier.targets.ec2.group.AsgFleet`, found by
its tags): a rollout surges where its ``max_size`` leaves room and holds the group while it runs.
A stack that lists its hosts (``inventory.source: static``) is a fixed fleet: no group, in place.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from frontier_hostside.names import HOST_ROOT
from frontier_settings import FieldProblem

from frontier import aws
from frontier.config.outputs import Ec2Outputs
from frontier.config.schema import Settings
from frontier.hosts.inventory import HostSpec, ssh_connection, static_hosts
from frontier.hosts.session import HostSession
from frontier.release.history import HistoryStore, stack_history
from frontier.release.release import Release
from frontier.rollout.rolling import Reporter, RolloutResult
from frontier.rollout.strategy import roll_hosts
from frontier.targets.ec2 import rules
from frontier.targets.ec2.balancer import AlbBalancer
from frontier.targets.ec2.discovery import HOST_PYTHON, discover
from frontier.targets.ec2.group import AsgFleet

# A surge host boots (drivers, image, weights) before its readiness timeout starts to count.
LAUNCH_ALLOWANCE_S = 900


class Ec2Backend:
    kind = "ec2"
    creates_buckets = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def hosts(self, group: str | None = None) -> list[HostSpec]:
        group_name = group or self.settings.serving_group.name
        if self.settings.inventory.source == "static":
            return static_hosts(self.settings, group_name, python=HOST_PYTHON, resolve_root=str)
        return discover(self.settings, self.aws_client("ec2"), group_name, root=HOST_ROOT, python=HOST_PYTHON)

    def outputs(self) -> Ec2Outputs[str]:
        """What ``pulumi up`` of the stack exported, as saved for ``fab``."""
        return aws.stack_outputs(self.settings, Ec2Outputs[str])

    def balancer(self) -> AlbBalancer:
        target_group = self.outputs().target_group_arn
        return AlbBalancer(self.aws_client("elbv2"), target_group, self.settings.runtime.port)

    def history_store(self) -> HistoryStore:
        outputs = self.outputs()
        return stack_history(
            self.settings, self.aws_client("s3"), outputs.history_bucket, outputs.history_prefix
        )

    def fleet(self, group: str | None = None) -> AsgFleet | None:
        """The node group's auto scaling group; None for a static inventory (a fixed fleet)."""
        if self.settings.inventory.source == "static":
            return None
        return AsgFleet(
            self.settings,
            self.aws_client("autoscaling"),
            self.aws_client("ec2"),
            group or self.settings.serving_group.name,
        )

    def rollout_size(self) -> int:
        return len(self.hosts())

    def roll(self, release: Release, kind: str, reporter: Reporter | None) -> RolloutResult:
        """Surge where the group can grow, else one batch at a time; the group held while it runs."""
        return roll_hosts(
            self.settings,
            self.history_store(),
            self.hosts(),
            self.balancer(),
            self.connect,
            release,
            kind,
            reporter,
            group=self.fleet(),
            surge=True,
            launch_timeout_s=self.settings.rollout.readiness_timeout_s + LAUNCH_ALLOWANCE_S,
        )

    def aws_client(self, service: str) -> Any:
        return aws.client(self.settings, service)

    def connect(self, host: HostSpec) -> Any:
        return ssh_connection(self.settings, host)

    def session(self, host: HostSpec) -> HostSession:
        return HostSession(self.settings, host, self.connect(host))

    def endpoint(self) -> str:
        return self.outputs().endpoint

    def api_key(self) -> str | None:
        return None

    def stack_problems(self) -> Iterator[FieldProblem]:
        return rules.stack_problems(self.settings)

    def rendered_files(self, digest: str) -> dict[str, str]:
        """Nothing beyond every stack's files: the ALB and its target group are Pulumi's."""
        return {}
