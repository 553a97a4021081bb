"""GPU node groups: launch template and auto scaling group sized and secured from the stack."""

from __future__ import annotations

import base64

import pytest
from infra_mocks import ROOT_DEVICE, fake_ami, run_program

from frontier.config.load import load_stack
from frontier.contracts import CACHE_DEVICE_NAME
from frontier.render.files import render_cloud_init
from infra.nodes import GPU_AMI_PARAMETER, architecture, needs_efa

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"


def template(graph):
    return graph.one(LAUNCH_TEMPLATE, f"{graph.stack}-{graph.settings.serving_group.name}-lt")


def asg(graph):
    return graph.one(ASG, f"{graph.stack}-{graph.settings.serving_group.name}-asg")


def volume(graph, device):
    return next(m["ebs"] for m in template(graph).inputs["blockDeviceMappings"] if m["deviceName"] == device)


def security_group_id(graph, key):
    return graph.one("aws:ec2/securityGroup:SecurityGroup", f"{graph.stack}-sg-{key}").id


_efa_graph = {}


@pytest.fixture
def efa():
    """Staging with EFA asked for on its node group: the placement-group path."""
    if not _efa_graph:
        settings = load_stack("staging")
        group = settings.serving_group.model_copy(update={"efa": True})
        _efa_graph["graph"] = run_program(settings.model_copy(update={"node_groups": (group,)}))
    return _efa_graph["graph"]


def test_launch_template_uses_the_stacks_instance_type(graph):
    assert template(graph).inputs["instanceType"] == graph.settings.serving_group.instance_type


def test_launch_template_boots_the_gpu_ami_found_by_its_ssm_parameter(graph):
    parameter = GPU_AMI_PARAMETER.format(arch="x86_64")
    assert ("aws:ssm/getParameter:getParameter", {"name": parameter}) in graph.invokes
    assert template(graph).inputs["imageId"] == fake_ami(parameter)


def test_instance_metadata_requires_imdsv2_within_two_hops(graph):
    options = template(graph).inputs["metadataOptions"]
    assert options["httpTokens"] == "required"
    assert options["httpPutResponseHopLimit"] in (1, 2)


def test_root_volume_is_encrypted_gp3_of_the_configured_size_on_the_amis_root_device(graph):
    root = volume(graph, ROOT_DEVICE)
    assert root == {
        "volumeType": "gp3",
        "volumeSize": graph.settings.serving_group.root_volume_gb,
        "encrypted": "true",
        "deleteOnTermination": "true",
    }


def test_model_cache_volume_is_encrypted_gp3_where_cloud_init_mounts_it(graph):
    cache = volume(graph, CACHE_DEVICE_NAME)
    assert cache["volumeType"] == "gp3" and cache["encrypted"] == "true"
    assert cache["volumeSize"] == graph.settings.serving_group.cache_volume_gb
    assert cache["throughput"] > 125  # above gp3's baseline: weights load at volume speed


def test_hosts_get_no_public_address_and_only_the_runtime_security_group(graph):
    [interface] = template(graph).inputs["networkInterfaces"]
    assert interface["associatePublicIpAddress"] == "false"
    assert interface["securityGroups"] == [security_group_id(graph, "runtime")]


def test_hosts_run_with_the_runtime_instance_profile(graph):
    profile = graph.one("aws:iam/instanceProfile:InstanceProfile")
    assert template(graph).inputs["iamInstanceProfile"] == {"arn": profile.outputs["arn"]}
    assert (
        profile.inputs["role"] == graph.one("aws:iam/role:Role", f"{graph.stack}-iam-runtime").outputs["name"]
    )


def test_user_data_is_the_cloud_init_rendered_for_the_group(graph):
    user_data = base64.b64decode(template(graph).inputs["userData"]).decode()
    assert user_data == render_cloud_init(graph.settings, graph.settings.serving_group)


def test_auto_scaling_group_follows_the_stacks_sizes(graph):
    group, inputs = graph.settings.serving_group, asg(graph).inputs
    assert (inputs["minSize"], inputs["desiredCapacity"], inputs["maxSize"]) == (
        group.min_size,
        group.desired_size,
        group.max_size,
    )


def test_auto_scaling_group_spreads_over_the_private_subnets(graph):
    assert asg(graph).inputs["vpcZoneIdentifiers"] == graph.outputs["private_subnet_ids"]


def test_auto_scaling_group_launches_the_templates_latest_version(graph):
    lt = template(graph)
    assert asg(graph).inputs["launchTemplate"] == {"id": lt.id, "version": str(lt.outputs["latestVersion"])}


def test_serving_hosts_join_the_target_group_and_are_replaced_when_unhealthy(graph):
    inputs = asg(graph).inputs
    assert inputs["targetGroupArns"] == [graph.outputs["target_group_arn"]]
    assert inputs["healthCheckType"] == "ELB"
    assert inputs["healthCheckGracePeriod"] >= graph.settings.rollout.readiness_timeout_s


def test_instances_carry_the_tags_fab_discovers_them_by(graph):
    tags = {t["key"]: t["value"] for t in asg(graph).inputs["tags"] if t["propagateAtLaunch"]}
    assert tags["frontier:stack"] == graph.stack
    assert tags["frontier:node-group"] == graph.settings.serving_group.name
    assert tags["frontier:role"] == "runtime"
    instance_tags = next(
        t["tags"] for t in template(graph).inputs["tagSpecifications"] if t["resourceType"] == "instance"
    )
    assert {k: instance_tags[k] for k in tags} == tags


def test_groups_without_efa_spread_without_a_placement_group(graph):
    assert not graph.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert "placementGroup" not in asg(graph).inputs
    assert "interfaceType" not in template(graph).inputs["networkInterfaces"][0]


def test_efa_groups_get_a_cluster_placement_group_in_one_zone(efa):
    placement = efa.one("aws:ec2/placementGroup:PlacementGroup")
    assert placement.inputs["strategy"] == "cluster"
    assert asg(efa).inputs["placementGroup"] == placement.outputs["name"]
    assert asg(efa).inputs["vpcZoneIdentifiers"] == efa.outputs["private_subnet_ids"][:1]
    assert template(efa).inputs["placement"] == {"groupName": placement.outputs["name"]}


def test_efa_groups_attach_an_efa_interface_and_talk_to_their_peers(efa):
    assert template(efa).inputs["networkInterfaces"][0]["interfaceType"] == "efa"
    runtime = security_group_id(efa, "runtime")
    for kind in ("Ingress", "Egress"):
        rules = [
            r.inputs
            for r in efa.of_type(f"aws:vpc/securityGroup{kind}Rule:SecurityGroup{kind}Rule")
            if r.inputs["securityGroupId"] == runtime and r.inputs["ipProtocol"] == "-1"
        ]
        assert [r["referencedSecurityGroupId"] for r in rules] == [runtime]


def test_a_model_sharded_across_nodes_turns_efa_on(staging):
    settings = staging.settings
    group = settings.serving_group
    assert not needs_efa(settings, group)
    wide = settings.model_copy(
        update={"runtime": settings.runtime.model_copy(update={"pipeline_parallel_size": 4})}
    )
    assert needs_efa(wide, group)


@pytest.mark.parametrize(
    ("instance_type", "arch"),
    [("p5.48xlarge", "x86_64"), ("g5g.xlarge", "arm64"), ("g6e.12xlarge", "x86_64")],
)
def test_architecture_follows_the_instance_family(instance_type, arch):
    assert architecture(instance_type) == arch
