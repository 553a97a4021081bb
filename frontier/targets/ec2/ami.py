"""``ami.latest``: the newest AMI AWS publishes for each node group, against the one the stack pins.

The stack pins ``node_groups[].ami_id`` so that `pulumi up` never drifts to whatever "latest" is
that day; this reads the public SSM parameter (the Deep Learning AMI for GPU groups, Canonical's
Ubuntu for CPU groups) and proposes the line to change. Applying it is an edit of the stack file
and a `pulumi up`, which rolls the group through an instance refresh behind the launch hook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from frontier.config.hardware import ami_parameter
from frontier.config.schema import Settings
from frontier.errors import FrontierError


@dataclass(frozen=True)
class AmiProposal:
    field: str
    group: str
    pinned: str
    latest: str
    parameter: str

    @property
    def current(self) -> bool:
        return self.pinned == self.latest

    def action(self) -> str:
        if self.current:
            return "up to date"
        return f"set {self.field}: {self.latest} (rolls as an instance refresh on `pulumi up`)"


def latest_amis(settings: Settings, ssm: Any) -> list[AmiProposal]:
    proposals = []
    for index, group in enumerate(settings.node_groups):
        parameter = ami_parameter(group)
        try:
            latest = ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
        except ClientError as exc:
            raise FrontierError(
                f"node_groups[{index}] ({group.name}): cannot read {parameter} in {settings.region}: "
                f"{exc.response['Error'].get('Message') or exc}"
            ) from None
        proposals.append(
            AmiProposal(f"node_groups[{index}].ami_id", group.name, group.ami_id, latest, parameter)
        )
    return proposals
