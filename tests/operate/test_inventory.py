"""Hosts come from the stack: a static list, or running EC2 instances tagged with the stack and group."""

from __future__ import annotations

import boto3
from frontier_hostside.names import HOST_ROOT, STACK_TAG
from frontier_hostside.names import NODE_GROUP_TAG as GROUP_TAG
from moto import mock_aws

from frontier import project
from frontier.targets import backend_for, load_stack
from frontier.targets.ec2.discovery import discover


def test_local_hosts_are_static_with_roots_inside_the_project():
    found = backend_for(load_stack("local")).hosts()
    assert [h.name for h in found] == ["host-1", "host-2", "host-3"]
    assert all(h.root.startswith(str(project.root())) and h.ssh_port == 2222 for h in found)


def test_cloud_hosts_are_the_running_instances_tagged_for_the_stack_and_group(monkeypatch):
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    settings = load_stack("prod")
    group = settings.serving_group.name
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=settings.region)
        image = ec2.register_image(Name="gpu-ami", RootDeviceName="/dev/xvda")["ImageId"]

        def launch(stack: str, node_group: str, count: int) -> list[str]:
            tags = [{"Key": STACK_TAG, "Value": stack}, {"Key": GROUP_TAG, "Value": node_group}]
            reply = ec2.run_instances(
                ImageId=image, MinCount=count, MaxCount=count, InstanceType="p5.48xlarge",
                TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
            )  # fmt: skip
            return [i["InstanceId"] for i in reply["Instances"]]

        ours = launch("prod", group, 3)
        launch("staging", group, 1)
        launch("prod", "other-group", 1)
        ec2.terminate_instances(InstanceIds=[ours[0]])

        found = discover(settings, ec2, group, root=HOST_ROOT, python="/usr/bin/python3")

    assert sorted(h.instance_id for h in found) == sorted(ours[1:])
    assert all(h.root == "/opt/frontier" and h.ssh_port == 22 and h.address.startswith("10.") for h in found)
