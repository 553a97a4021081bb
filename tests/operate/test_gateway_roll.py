"""``fab gateway.roll``: an instance refresh of the gateway's auto scaling group, waited for.

The group is moto's, tagged as Pulumi tags it (infra/gateway.py), and found by those tags. moto
5.2 does not implement the instance refresh calls (StartInstanceRefresh,
DescribeInstanceRefreshes: the first test below says so), so :class:`Refreshes` answers exactly
those two, with the statuses AWS documents, and records what was asked; every other call goes to
moto.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from frontier_hostside.names import ROLE_TAG, STACK_TAG
from invoke import Context
from invoke.exceptions import Exit
from test_fleet_ec2 import REGION

from frontier.cli import access
from frontier.targets.ec2.backend import Ec2Backend
from frontier.targets.ec2.gateway import GatewayRollError, wait_for_refresh

GROUP = "prod-gateway-asg-9f8e7d"


class Refreshes:
    """moto's auto scaling client, plus the two instance refresh calls moto lacks."""

    def __init__(self, client: Any, statuses: list[dict[str, Any]], *, busy: bool = False) -> None:
        self.client = client
        self.statuses = statuses
        self.busy = busy
        self.started: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def start_instance_refresh(self, **kwargs: Any) -> dict[str, Any]:
        if self.busy:
            raise ClientError(
                {
                    "Error": {
                        "Code": "InstanceRefreshInProgress",
                        "Message": "An Instance Refresh is already in progress",
                    }
                },
                "StartInstanceRefresh",
            )
        self.started.append(kwargs)
        return {"InstanceRefreshId": "refresh-1"}

    def describe_instance_refreshes(self, **kwargs: Any) -> dict[str, Any]:
        assert kwargs == {"AutoScalingGroupName": GROUP, "InstanceRefreshIds": ["refresh-1"]}
        current = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return {"InstanceRefreshes": [{"InstanceRefreshId": "refresh-1", **current}]}


@pytest.fixture
def gateway_group(aws):
    """The prod stack's gateway group: two hosts, tagged with the stack and the gateway's role."""
    ec2 = boto3.client("ec2", region_name=REGION)
    template = ec2.create_launch_template(
        LaunchTemplateName="prod-gateway",
        LaunchTemplateData={"ImageId": "ami-12345678", "InstanceType": "c7i.large"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=GROUP,
        LaunchTemplate={"LaunchTemplateId": template},
        MinSize=2,
        MaxSize=4,
        DesiredCapacity=2,
        AvailabilityZones=[f"{REGION}a"],
        Tags=[
            {
                "Key": k,
                "Value": v,
                "PropagateAtLaunch": True,
                "ResourceId": GROUP,
                "ResourceType": "auto-scaling-group",
            }
            for k, v in {STACK_TAG: "prod", ROLE_TAG: "gateway"}.items()
        ],
    )
    return autoscaling


def answering(monkeypatch: pytest.MonkeyPatch, refreshes: Refreshes) -> None:
    real = Ec2Backend.aws_client

    def client(self: Ec2Backend, service: str) -> Any:
        return refreshes if service == "autoscaling" else real(self, service)

    monkeypatch.setattr(Ec2Backend, "aws_client", client)


def test_moto_does_not_implement_the_instance_refresh_calls(gateway_group):
    with pytest.raises(NotImplementedError, match="start_instance_refresh"):
        gateway_group.start_instance_refresh(AutoScalingGroupName=GROUP)


def test_fab_gateway_roll_replaces_every_host_keeping_the_desired_count_healthy_and_waits(
    gateway_group, monkeypatch, capsys
):
    refreshes = Refreshes(
        gateway_group,
        [
            {"Status": "Pending", "PercentageComplete": 0, "InstancesToUpdate": 2},
            {"Status": "InProgress", "PercentageComplete": 50, "InstancesToUpdate": 1},
            {"Status": "Successful", "PercentageComplete": 100, "InstancesToUpdate": 0},
        ],
    )
    answering(monkeypatch, refreshes)
    monkeypatch.setattr("frontier.targets.ec2.gateway.POLL_S", 0.0)
    access.gateway_roll(Context(), stack="prod")
    [started] = refreshes.started
    assert started["AutoScalingGroupName"] == GROUP and started["Strategy"] == "Rolling"
    # Never fewer healthy hosts than desired: each replacement first, up to twice the count.
    assert started["Preferences"]["MinHealthyPercentage"] == 100
    assert started["Preferences"]["MaxHealthyPercentage"] == 200
    # Hosts that match the template are replaced too: what they boot changed in the bucket.
    assert started["Preferences"]["SkipMatching"] is False
    out = capsys.readouterr().out
    assert "InProgress 50% (1 to replace)" in out
    assert out.rstrip().endswith("gateway of stack prod: every host replaced")


def test_a_refresh_that_fails_ends_fab_gateway_roll_with_its_reason(gateway_group, monkeypatch):
    reason = "Instance i-0abc failed the ELB health check"
    answering(monkeypatch, Refreshes(gateway_group, [{"Status": "Failed", "StatusReason": reason}]))
    with pytest.raises(Exit) as failed:
        access.gateway_roll(Context(), stack="prod")
    assert failed.value.code == 2
    assert f"refresh refresh-1 of {GROUP} ended Failed: {reason}" in str(failed.value.message)


def test_a_refresh_already_running_is_refused_saying_so(gateway_group, monkeypatch):
    answering(monkeypatch, Refreshes(gateway_group, [], busy=True))
    with pytest.raises(Exit) as refused:
        access.gateway_roll(Context(), stack="prod")
    assert f"the gateway group {GROUP} is already being refreshed" in str(refused.value.message)


def test_a_stack_without_a_gateway_group_is_refused_naming_the_tags_it_looked_for(aws):
    with pytest.raises(Exit) as refused:
        access.gateway_roll(Context(), stack="prod")
    assert "no auto scaling group tagged frontier:stack=prod and frontier:role=gateway" in str(
        refused.value.message
    )


def test_a_timeout_outside_its_range_is_refused_before_any_call(aws):
    with pytest.raises(Exit, match=r"--timeout 0: must be seconds in \(0, 86400\]"):
        access.gateway_roll(Context(), stack="prod", timeout=0)


def test_a_refresh_still_running_at_the_timeout_is_reported_and_left_to_aws(gateway_group):
    refreshes = Refreshes(gateway_group, [{"Status": "InProgress", "PercentageComplete": 50}])
    ticks = iter(range(100))
    with pytest.raises(GatewayRollError, match=r"still InProgress \(50% done\) after 3 s; it goes on"):
        wait_for_refresh(
            refreshes, GROUP, "refresh-1", timeout_s=3, clock=lambda: float(next(ticks)), sleep=lambda s: None
        )
