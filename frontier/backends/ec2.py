"""EC2: hosts found by their tags, reached over SSH, drained through the ALB target group.

Bucket names, the target group and the endpoint come from the Pulumi stack outputs saved under
``.frontier/outputs/<stack>.json`` (see :mod:`frontier.aws`).
"""

from __future__ import annotations

from frontier import aws
from frontier.backends.common import BackendBase
from frontier.contracts import HOST_ROOT
from frontier.fleet.balancer import AlbBalancer, Balancer
from frontier.fleet.inventory import HostSpec, discover, static_hosts
from frontier.release.history import HistoryStore

HOST_PYTHON = "/usr/bin/python3"


class Ec2Backend(BackendBase):
    kind = "ec2"

    def hosts(self, group: str | None = None) -> list[HostSpec]:
        group_name = group or self.settings.serving_group.name
        if self.settings.inventory.source == "static":
            return static_hosts(self.settings, group_name, python=HOST_PYTHON, resolve_root=str)
        return discover(self.settings, self.aws_client("ec2"), group_name, root=HOST_ROOT, python=HOST_PYTHON)

    def balancer(self) -> Balancer:
        target_group = aws.stack_output(self.settings, "target_group_arn")
        return AlbBalancer(self.aws_client("elbv2"), target_group, self.settings.runtime.port)

    def history_store(self) -> HistoryStore:
        return self._outputs_history()

    def endpoint(self) -> str:
        return aws.stack_output(self.settings, "endpoint")

    def api_key(self) -> str | None:
        return None
