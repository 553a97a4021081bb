"""The EC2 node group as an auto scaling group, against moto: scale, surge, hold, AMI proposals.

moto's auto scaling launches instances InService at once (it has no lifecycle hooks to wait on),
which is what a host looks like once its bootstrap completed the launch hook.
"""

from __future__ import annotations

import json

import boto3
import pytest
from frontier_hostside.names import NODE_GROUP_TAG, ROLE_TAG, STACK_TAG
from invoke import Context
from invoke.exceptions import Exit

from frontier.cli import ami, ops
from frontier.config.hardware import ami_parameter
from frontier.hosts.inventory import HostSpec
from frontier.release.artifact import Artifact
from frontier.release.release import Release
from frontier.rollout.rolling import HostResult, RolloutResult
from frontier.targets import load_stack
from frontier.targets.ec2.ami import latest_amis
from frontier.targets.ec2.backend import Ec2Backend
from frontier.targets.ec2.group import AsgFleet, FleetError
from tests.aws_host import publish_parameter

REGION = "us-east-1"


def publish_ami(name: str, value: str) -> None:
    """An AMI parameter AWS publishes under /aws/service/, in moto's store."""
    publish_parameter(name, value, REGION)


@pytest.fixture
def prod(aws):
    """The prod stack's node group as Pulumi makes it: 4..10 hosts, 6 desired, tagged for fab."""
    settings = load_stack("prod")
    tagged_group(
        settings,
        "prod-h100-asg-1a2b3c",
        "prod-h100",
        settings.serving_group.desired_size,
        "10.40",
        {"Name": "frontier-prod-h100"},
        instance_type="p5.48xlarge",
    )
    runtime_secret(settings)
    return settings


def runtime_secret(settings) -> None:  # noqa: ANN001
    """The runtimes' API-key secret as Pulumi makes it: a deploy reads it to verify its canary."""
    boto3.client("secretsmanager", region_name=REGION).create_secret(
        Name=settings.runtime.api_keys_secret, SecretString=json.dumps({"keys": ["fleet-test-key"]})
    )


def tagged_group(
    settings,  # noqa: ANN001
    name: str,
    template_name: str,
    desired: int,
    network: str,
    extra_tags: dict[str, str] | None = None,
    *,
    instance_type: str | None = None,
) -> None:
    """The stack's serving group as Pulumi makes it in moto: a subnet of ``network``.0.0/16, a launch
    template, and the auto scaling group tagged for fab's discovery, ``desired`` hosts."""
    group = settings.serving_group
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock=f"{network}.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"{network}.1.0/24", AvailabilityZone=f"{REGION}a")[
        "Subnet"
    ]["SubnetId"]
    template = ec2.create_launch_template(
        LaunchTemplateName=template_name,
        LaunchTemplateData={"ImageId": group.ami_id, "InstanceType": instance_type or group.instance_type},
    )["LaunchTemplate"]["LaunchTemplateId"]
    tags = {STACK_TAG: settings.stack, NODE_GROUP_TAG: group.name, ROLE_TAG: "runtime", **(extra_tags or {})}
    boto3.client("autoscaling", region_name=REGION).create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateId": template},
        MinSize=group.min_size,
        MaxSize=group.max_size,
        DesiredCapacity=desired,
        VPCZoneIdentifier=subnet,
        Tags=[
            {
                "Key": k,
                "Value": v,
                "PropagateAtLaunch": True,
                "ResourceId": name,
                "ResourceType": "auto-scaling-group",
            }
            for k, v in tags.items()
        ],
    )


def fleet(settings) -> AsgFleet:
    return AsgFleet(
        settings,
        boto3.client("autoscaling", region_name=REGION),
        boto3.client("ec2", region_name=REGION),
        "h100",
        poll_s=0.01,
    )


def group_state() -> dict:
    return boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups()[
        "AutoScalingGroups"
    ][0]


def test_the_group_is_found_by_its_stack_and_node_group_tags(prod):
    f = fleet(prod)
    assert f.name == "prod-h100-asg-1a2b3c"
    assert (f.size().min_size, f.size().desired, f.size().max_size) == (4, 6, 10)
    other = prod.model_copy(update={"stack": "staging"})
    with pytest.raises(FleetError, match="no auto scaling group tagged frontier:stack=staging"):
        fleet(other)


def test_scale_sets_the_desired_capacity_within_min_and_max(prod):
    assert fleet(prod).scale(8).desired == 8
    assert group_state()["DesiredCapacity"] == 8
    assert len(group_state()["Instances"]) == 8


@pytest.mark.parametrize("replicas", [3, 11])
def test_scale_outside_min_and_max_is_refused_and_changes_nothing(prod, replicas):
    with pytest.raises(FleetError) as refused:
        fleet(prod).scale(replicas)
    assert f"--replicas {replicas}:" in str(refused.value)
    assert "min_size 4 and max_size 10" in str(refused.value)
    assert group_state()["DesiredCapacity"] == 6


def test_fab_scale_task_sets_it_and_refuses_a_value_outside_with_the_range(prod, capsys):
    ops.scale(Context(), stack="prod", replicas=7)
    assert "desired 6 -> 7 (min 4, max 10)" in capsys.readouterr().out
    with pytest.raises(Exit) as refused:
        ops.scale(Context(), stack="prod", replicas=12)
    assert "--replicas 12" in str(refused.value.message) and "max_size 10" in str(refused.value.message)
    assert group_state()["DesiredCapacity"] == 7


def test_a_deploy_holds_its_hosts_from_scale_in_and_pauses_az_rebalance(prod):
    f = fleet(prod)
    hosts = Ec2Backend(prod, prod.only_pool).hosts()
    assert len(hosts) == 6
    with f.hold(hosts):
        state = group_state()
        assert [p["ProcessName"] for p in state["SuspendedProcesses"]] == ["AZRebalance"]
        assert all(i["ProtectedFromScaleIn"] for i in state["Instances"])
    state = group_state()
    assert state["SuspendedProcesses"] == []
    assert not any(i["ProtectedFromScaleIn"] for i in state["Instances"])


def test_the_hold_is_undone_when_the_rollout_fails(prod):
    f = fleet(prod)
    with pytest.raises(RuntimeError), f.hold(Ec2Backend(prod, prod.only_pool).hosts()):
        raise RuntimeError("rollout died")
    assert group_state()["SuspendedProcesses"] == []


def test_surge_grows_the_group_with_new_hosts_then_retires_old_ones(prod):
    f = fleet(prod)
    old = Ec2Backend(prod, prod.only_pool).hosts()
    new = f.grow(1, timeout_s=30)
    assert len(new) == 1 and isinstance(new[0], HostSpec)
    assert new[0].instance_id not in {h.instance_id for h in old}
    assert group_state()["DesiredCapacity"] == 7
    f.retire(old[:1])
    state = group_state()
    assert state["DesiredCapacity"] == 6
    assert old[0].instance_id not in {i["InstanceId"] for i in state["Instances"]}


def test_surge_beyond_max_size_is_refused(prod):
    f = fleet(prod)
    f.scale(10)
    with pytest.raises(FleetError, match="exceed max_size 10"):
        f.grow(1, timeout_s=1)


def test_ami_latest_proposes_the_published_ami_against_the_pinned_one(prod):
    ssm = boto3.client("ssm", region_name=REGION)
    parameter = ami_parameter(prod.serving_group)
    publish_ami(parameter, "ami-0fedcba9876543210")
    [proposal] = latest_amis(prod, ssm)
    assert (proposal.field, proposal.pinned, proposal.latest) == (
        "node_groups[0].ami_id",
        prod.serving_group.ami_id,
        "ami-0fedcba9876543210",
    )
    assert proposal.action().startswith("set node_groups[0].ami_id: ami-0fedcba9876543210")
    publish_ami(parameter, prod.serving_group.ami_id)
    assert latest_amis(prod, ssm)[0].action() == "up to date"


def test_fab_ami_latest_on_a_closed_network_proposes_baking_the_newest_stock_image(prod, capsys):
    publish_ami(ami_parameter(prod.serving_group), "ami-0fedcba9876543210")
    ami.ami_latest(Context(), stack="prod")
    out = capsys.readouterr().out
    assert "fab ami.bake -s prod --group h100 --subnet SUBNET --source ami-0fedcba9876543210" in out
    assert "->" not in out  # a stock image is the bake's source, never the pin


def test_fab_ami_latest_where_hosts_reach_the_internet_prints_the_line_to_change(prod, capsys, monkeypatch):
    opened = prod.model_copy(update={"network": prod.network.model_copy(update={"egress": "internet"})})
    monkeypatch.setattr(ami, "settings_for", lambda _: opened)
    publish_ami(ami_parameter(prod.serving_group), "ami-0fedcba9876543210")
    ami.ami_latest(Context(), stack="prod")
    out = capsys.readouterr().out
    assert f"node_groups[0].ami_id: {prod.serving_group.ami_id} -> ami-0fedcba9876543210" in out


def test_a_missing_parameter_is_reported_naming_it(prod):
    with pytest.raises(Exception, match="cannot read /aws/service/deeplearning"):
        latest_amis(prod, boto3.client("ssm", region_name=REGION))


class RecordedRollout:
    """Stands in for the per-host rollout (:class:`frontier.rollout.rolling.Rollout`): the SSH rollout
    itself is tested against real sshd hosts elsewhere; here moto's instances have no sshd to reach."""

    seen: list[tuple[list[str], int, list[str]]] = []

    def __init__(self, settings, pool, hosts, balancer, connect, reporter, verification=None) -> None:
        self.hosts = hosts

    def run(self, release, wheel, kind):
        state = group_state()
        protected = {i["InstanceId"] for i in state["Instances"] if i["ProtectedFromScaleIn"]}
        assert {
            h.instance_id for h in self.hosts
        } <= protected  # surge hosts are not the policy's to take back
        self.seen.append(
            (
                [h.instance_id for h in self.hosts],
                state["DesiredCapacity"],
                [p["ProcessName"] for p in state["SuspendedProcesses"]],
            )
        )
        return RolloutResult(
            kind,
            release.id,
            hosts=[HostResult(h.name, to_release=release.id, outcome="updated") for h in self.hosts],
        )


@pytest.fixture
def recorded(monkeypatch) -> list[tuple[list[str], int, list[str]]]:
    """What each per-host rollout saw: its hosts, the group's desired capacity, the held processes."""
    monkeypatch.setattr("frontier.rollout.strategy.Rollout", RecordedRollout)
    monkeypatch.setattr(RecordedRollout, "seen", [])
    return RecordedRollout.seen


def test_an_ec2_rollout_surges_while_holding_the_group_and_says_so(prod, recorded, saved_outputs):
    # A deploy rolls after it stored the release, so the history bucket exists.
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=saved_outputs.ec2(prod).history_bucket)
    surging = prod.model_copy(update={"rollout": prod.rollout.model_copy(update={"max_surge": 2})})
    backend = Ec2Backend(surging, surging.only_pool)
    old = {h.instance_id for h in backend.hosts()}
    release = Release(Artifact("sha256:" + "a" * 64, "image"), {"runtime.yaml": "x: 1\n"})
    result = backend.roll(release, "deploy", None)
    assert result.outcome == "succeeded"
    assert result.strategy.startswith("surge: +2 host(s) first")
    # Three waves of two new hosts, each rolled while the group ran 8 (6 + 2) and AZRebalance waited.
    assert [(len(ids), desired, held) for ids, desired, held in recorded] == [(2, 8, ["AZRebalance"])] * 3
    assert not any(set(ids) & old for ids, _, _ in recorded)
    state = group_state()
    assert state["DesiredCapacity"] == 6 and state["SuspendedProcesses"] == []
    assert not any(i["ProtectedFromScaleIn"] for i in state["Instances"])
    assert not old & {i["InstanceId"] for i in state["Instances"]}  # every old host retired


def test_an_ec2_rollout_at_max_size_goes_one_unavailable_at_a_time(prod, recorded, saved_outputs):
    saved_outputs.ec2(prod, target_group_arn="arn:tg", history_bucket="frontier-prod-history")
    boto3.client("s3", region_name=REGION).create_bucket(Bucket="frontier-prod-history")
    fleet(prod).scale(10)
    result = Ec2Backend(prod, prod.only_pool).roll(Release(Artifact("sha256:" + "b" * 64, "image"), {}), "deploy", None)
    assert result.strategy.startswith(
        "one-unavailable: 1 host(s) out of service at a time (the group is at max_size"
    )
    assert [desired for _, desired, _ in recorded] == [10]
    assert group_state()["DesiredCapacity"] == 10


def test_fab_history_says_how_capacity_was_kept_and_lists_host_boots(prod, saved_outputs, capsys):
    bucket = saved_outputs.ec2(prod).history_bucket
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=bucket)
    record = {
        "kind": "deploy", "stack": "prod", "who": "ops@box", "started_at": "2026-12-03T09:00:00.000000Z",
        "duration_s": 1800.0, "digest": "sha256:" + "a" * 64, "config_hash": "sha256:" + "b" * 64,
        "release": "r-0123456789ab", "outcome": "succeeded", "reason": "",
        "strategy": "surge: +1 host(s) first, then retire as many old ones (max_size 10 leaves room for 4 above desired 6)",
        "hosts": [],
    }  # fmt: skip
    s3.put_object(
        Bucket=bucket,
        Key="history/prod/records/2026-12-03T090000-deploy-r-0123456789ab.json",
        Body=json.dumps(record),
    )
    boot = {"at": "2026-12-03T093000Z", "host": "i-0abc", "node_group": "h100", "release": "r-0123456789ab",
            "outcome": "abandoned", "reason": "agent wait-ready: not ready after 900s"}  # fmt: skip
    s3.put_object(
        Bucket=bucket, Key="history/prod/boots/2026-12-03T093000Z-i-0abc.json", Body=json.dumps(boot)
    )
    ops.history(Context(), stack="prod")
    out = capsys.readouterr().out
    assert "last deploy kept capacity by surge: +1 host(s) first" in out
    assert "host boots of stack prod" in out and "i-0abc" in out and "abandoned" in out
