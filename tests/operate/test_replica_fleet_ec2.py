"""A node group whose replica spans two nodes, against moto: whole replicas in scale and rollout.

moto's auto scaling launches the instances InService at once; the slot records are written as the
hosts' rendezvous writes them (frontier_hostside.rendezvous.Holder), in an order unlike the
instances' own, so the rollout's order can only come from the slots.
"""

from __future__ import annotations

import boto3
import pytest
from frontier_hostside.rendezvous import Holder, slot_key
from test_fleet_ec2 import REGION, runtime_secret, tagged_group

from frontier.release.artifact import Artifact
from frontier.release.release import Release
from frontier.rollout.rolling import Event, waves
from frontier.targets import backend_for, load_stack
from frontier.targets.ec2.backend import Ec2Backend
from frontier.targets.ec2.group import AsgFleet, FleetError

HOSTS = 4  # two replicas of two nodes


@pytest.fixture
def multinode(aws, saved_outputs):
    """prod-multinode's group as Pulumi makes it (4 hosts: 2 replicas), its history bucket, its outputs."""
    settings = load_stack("prod-multinode")
    tagged_group(settings, "prod-multinode-h100x2-asg", "prod-multinode-h100x2", HOSTS, "10.44")
    runtime_secret(settings)
    outputs = saved_outputs.ec2(settings)
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=outputs.history_bucket)
    return settings, outputs


def claim_slots(settings, outputs, order: list[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """The group's instances (by id) claim the slots in ``order``; slot -> instance id."""
    instances = sorted(
        i["InstanceId"]
        for i in boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_instances()[
            "AutoScalingInstances"
        ]
    )
    s3 = boto3.client("s3", region_name=REGION)
    claimed = {}
    for instance_id, (replica, node) in zip(instances, order, strict=True):
        holder = Holder(instance_id, "10.44.1.1", "2026-12-01T00:00:00Z", "k" * 64 if node == 0 else "")
        key = slot_key(outputs.history_prefix, settings.serving_group.name, replica, node)
        s3.put_object(Bucket=outputs.history_bucket, Key=key, Body=holder.to_bytes())
        claimed[(replica, node)] = instance_id
    return claimed


def test_a_rollout_takes_the_hosts_of_a_spanning_group_replica_by_replica(multinode) -> None:
    settings, outputs = multinode
    claimed = claim_slots(settings, outputs, [(1, 1), (0, 0), (1, 0), (0, 1)])
    hosts = Ec2Backend(settings, settings.only_pool).hosts()
    assert [h.instance_id for h in hosts] == [claimed[s] for s in [(0, 0), (0, 1), (1, 0), (1, 1)]]


def test_each_rollout_wave_of_a_spanning_group_holds_whole_replicas(multinode) -> None:
    settings, outputs = multinode
    claimed = claim_slots(settings, outputs, [(1, 1), (0, 0), (1, 0), (0, 1)])
    by_instance = {instance: slot for slot, instance in claimed.items()}
    rollout = settings.rollout
    for _, wave in waves(Ec2Backend(settings, settings.only_pool).hosts(), rollout.canary_hosts, rollout.batch_size):
        replicas = [by_instance[h.instance_id][0] for h in wave]
        assert len(replicas) == 2 and len(set(replicas)) == 1


def test_a_host_that_holds_no_slot_yet_is_rolled_last(multinode) -> None:
    settings, outputs = multinode
    instances = sorted(
        i["InstanceId"]
        for i in boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_instances()[
            "AutoScalingInstances"
        ]
    )
    s3 = boto3.client("s3", region_name=REGION)
    for instance_id, (replica, node) in zip(instances[1:], [(0, 1), (0, 0), (1, 0)], strict=True):
        key = slot_key(outputs.history_prefix, settings.serving_group.name, replica, node)
        s3.put_object(
            Bucket=outputs.history_bucket, Key=key, Body=Holder(instance_id, "10.44.1.1", "t").to_bytes()
        )
    assert Ec2Backend(settings, settings.only_pool).hosts()[-1].instance_id == instances[0]


def test_a_spanning_group_rolls_in_place_never_by_surge(multinode) -> None:
    settings, _ = multinode
    assert "a replica spans 2 nodes" in Ec2Backend(settings, settings.only_pool).in_place_reason()
    assert backend_for(load_stack("prod")).in_place_reason() == ""


def test_scaling_a_spanning_group_to_part_of_a_replica_is_refused(multinode) -> None:
    settings, _ = multinode
    fleet = AsgFleet(
        settings,
        boto3.client("autoscaling", region_name=REGION),
        boto3.client("ec2", region_name=REGION),
        settings.serving_group.name,
    )
    with pytest.raises(FleetError, match=r"--replicas 5: a replica of node group 'h100x2' spans 2 hosts"):
        fleet.scale(5)
    assert fleet.size().desired == HOSTS
    assert fleet.scale(6).desired == 6


def test_a_deploy_of_a_spanning_group_takes_a_whole_replica_as_its_canary_in_place(multinode) -> None:
    settings, outputs = multinode
    claimed = claim_slots(settings, outputs, [(1, 1), (0, 0), (1, 0), (0, 1)])
    backend = Ec2Backend(settings, settings.only_pool)
    store = backend.history_store()
    artifact = Artifact("sha256:" + "ab" * 32, "image", image=f"registry/runtime@sha256:{'ab' * 32}")
    new = Release(artifact, {"runtime.yaml": "note: new\n"})
    store.put_release(new)
    events: list[Event] = []
    result = backend.roll(new, "deploy", events.append)
    # No host answers SSH here: the canary fails and is restored; what matters is what it took.
    [canary] = [e for e in events if e.phase == "canary"]
    by_name = {h.name: h.instance_id for h in backend.hosts()}
    assert [by_name[name] for name in canary.host.split(",")] == [claimed[(0, 0)], claimed[(0, 1)]]
    assert result.strategy == (
        "one-unavailable: 2 host(s) out of service at a time "
        "(a replica spans 2 nodes (runtime.nodes_per_replica): whole replicas roll in place)"
    )
    assert len(backend.hosts()) == HOSTS  # nothing was launched
