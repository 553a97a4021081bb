"""A deploy on EC2 and the hosts its auto scaling group launches meanwhile, against moto.

moto's group launches instances InService at once, as hosts look once their bootstrap completed the
launch hook. No host here answers SSH (the prod stack reaches its hosts through a bastion this
machine has no key for), so every rollout fails and restores: which is the path where a host that
joined mid-deploy must end on the last good release, not on the one that failed.
"""

from __future__ import annotations

import json

import boto3
import pytest
from frontier_hostside.names import DEPLOYING_POINTER
from test_fleet_ec2 import REGION, fleet, group_state, prod  # noqa: F401 - prod is a fixture

from frontier.release.artifact import Artifact
from frontier.release.history import iso, now
from frontier.release.release import Release
from frontier.rollout.rolling import Event, HostResult, RolloutResult
from frontier.targets.ec2.backend import Ec2Backend, joined_hosts, name_the_release_being_rolled


def release(note: str) -> Release:
    artifact = Artifact("sha256:" + "ab" * 32, "image", image=f"registry/runtime@sha256:{'ab' * 32}")
    return Release(artifact, {"runtime.yaml": json.dumps({"note": note}) + "\n"})


@pytest.fixture
def deployed(prod, saved_outputs):  # noqa: F811
    """The prod stack's group as Pulumi creates it (replacement suspended), one good release."""
    outputs = saved_outputs.ec2(prod)
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=outputs.history_bucket)
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    autoscaling.suspend_processes(
        AutoScalingGroupName=fleet(prod).name, ScalingProcesses=["ReplaceUnhealthy"]
    )
    backend = Ec2Backend(prod, prod.only_pool)
    store = backend.history_store()
    good = release("good")
    store.put_release(good)
    store.append({"kind": "deploy", "started_at": iso(now()), "release": good.id, "outcome": "succeeded"})
    return backend, store, good


def test_hosts_that_join_during_a_failed_deploy_are_revisited_with_the_last_good_release(deployed):
    backend, store, good = deployed
    failing = release("failing")
    store.put_release(failing)
    pointers: list[str] = []
    before = {i["InstanceId"] for i in group_state()["Instances"]}

    def meanwhile(event: Event) -> None:
        # The first step of the rollout: the pointer is there, and the group scales out by one.
        if not pointers:
            body = store.s3.get_object(Bucket=store.bucket, Key=store.prefix + DEPLOYING_POINTER)[
                "Body"
            ].read()
            pointers.append(json.loads(body)["release"])
            f = fleet(backend.settings)
            f.scale(f.size().desired + 1)

    result = backend.roll(failing, "deploy", meanwhile)
    assert pointers == [failing.id]
    assert result.outcome != "succeeded"
    joined = {
        i["InstanceId"] for i in group_state()["Instances"] if i["LifecycleState"] == "InService"
    } - before
    joined_names = {h.name for h in backend.hosts() if h.instance_id in joined}
    visited = {h.name: h for h in result.hosts}
    # Surge hosts were the rollout's own; the one the scale-out added was revisited in the final
    # pass, with the last good release (it could not be reached here, which the reason says).
    [late] = [name for name in joined_names if visited.get(name) and visited[name].to_release == good.id]
    assert "final pass over" in result.reason and late in result.reason
    # The failed deploy's release names nothing any more: later hosts boot the last good one.
    listed = store.s3.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix + DEPLOYING_POINTER)
    assert listed.get("KeyCount", 0) == 0
    # No release succeeded: the group still keeps hosts that have nothing to serve.
    assert not fleet(backend.settings).replaces_unhealthy()


def test_a_deploy_that_succeeds_keeps_naming_its_release_and_turns_on_replacing_unhealthy_hosts(deployed):
    backend, store, _ = deployed
    new = release("new")
    store.put_release(new)
    f = fleet(backend.settings)
    hosts = backend.hosts()
    # The deploy's own hold (AZRebalance) leaves the first-release suspension alone.
    with f.hold(hosts):
        pass
    assert not f.replaces_unhealthy()
    with store.locked(f"deploy {new.id}", ttl_s=3600):
        name_the_release_being_rolled(store, new, "deploy")
        result = RolloutResult("deploy", new.id, hosts=[HostResult(h.name, to_release=new.id) for h in hosts])
        backend.conclude(f, store, hosts, new, result, None, launch_timeout_s=1)
    assert f.replaces_unhealthy() and group_state()["SuspendedProcesses"] == []
    # Until the record that makes it current is written (right after), hosts still boot it.
    body = store.s3.get_object(Bucket=store.bucket, Key=store.prefix + DEPLOYING_POINTER)["Body"].read()
    assert json.loads(body)["release"] == new.id
    assert result.reason == ""  # nobody joined: nothing more to do


def test_a_host_that_joins_a_deploy_that_succeeds_is_revisited_with_the_new_release(deployed):
    backend, store, good = deployed
    new = release("new")
    store.put_release(new)
    f = fleet(backend.settings)
    hosts = backend.hosts()
    f.scale(f.size().desired + 1)  # launched while the rollout ran
    [late] = [h for h in backend.hosts() if h.name not in {r.name for r in hosts}]
    result = RolloutResult("deploy", new.id, hosts=[HostResult(h.name, to_release=new.id) for h in hosts])
    backend.conclude(f, store, hosts, new, result, None, launch_timeout_s=1)
    [revisited] = [h for h in result.hosts if h.name == late.name]
    assert revisited.to_release == new.id != good.id
    # It could not be reached here (no SSH to moto's instances): the record's reason says so.
    assert f"final pass over {late.name}" in result.reason


def test_only_in_service_hosts_the_rollout_neither_started_with_nor_launched_have_joined(prod):  # noqa: F811
    hosts = Ec2Backend(prod, prod.only_pool).hosts()
    started_with, surge, joined, leaving = hosts[:3], hosts[3], hosts[4], hosts[5]
    result = RolloutResult("deploy", "r-000000000000", hosts=[HostResult(surge.name)])
    in_service = {h.instance_id for h in hosts} - {leaving.instance_id}
    assert joined_hosts(started_with, result, hosts, in_service) == [joined]
