"""GPU hosts go where the region offers their type, within the account's vCPU quotas, or the stack is
refused before anything is created (one line naming the zone or the quota)."""

from __future__ import annotations

import pytest
from infra_mocks import run_program
from k8s_mocks import run_kubernetes

from frontier.config.schema import Settings
from frontier.targets import load_stack
from infra.errors import ProvisionError
from infra.placement import ON_DEMAND_VCPU_QUOTAS, quota_of

ASG = "aws:autoscaling/group:Group"
OFFERINGS = "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings"
QUOTA = "aws:servicequotas/getServiceQuota:getServiceQuota"


def serving_asg(graph):
    return graph.one(ASG, f"{graph.stack}-{graph.settings.serving_group.name}-asg")


def with_efa(settings: Settings) -> Settings:
    group = settings.serving_group.model_copy(update={"efa": True})
    return settings.model_copy(update={"node_groups": (group,)})


def zone(settings: Settings, index: int) -> str:
    return f"{settings.region}{'abcdef'[index]}"


def test_instance_types_count_against_their_familys_on_demand_vcpu_quota():
    assert quota_of("p5.48xlarge") == ON_DEMAND_VCPU_QUOTAS["p"]
    assert quota_of("p4de.24xlarge").code == "L-417A185B"
    assert quota_of("g6e.12xlarge").code == "L-DB2E81BA"
    assert quota_of("vt1.3xlarge") == ON_DEMAND_VCPU_QUOTAS["g"]
    assert quota_of("c7i.4xlarge") is None


def test_the_program_asks_for_offerings_and_quotas_of_its_gpu_types_only():
    settings = load_stack("dev")
    graph = run_program(settings)
    [(_, offerings)] = [call for call in graph.invokes if call[0] == OFFERINGS]
    assert offerings["locationType"] == "availability-zone"
    assert offerings["filters"] == [
        {"name": "instance-type", "values": [settings.serving_group.instance_type]}
    ]
    assert [args["quotaCode"] for token, args in graph.invokes if token == QUOTA] == ["L-DB2E81BA"]


def test_a_group_spreads_over_only_the_zones_that_offer_its_type():
    settings = load_stack("staging")
    unoffered = {settings.serving_group.instance_type: {zone(settings, 0)}}
    graph = run_program(settings, unoffered=unoffered)
    subnets = graph.outputs["private_subnet_ids"]
    assert serving_asg(graph).inputs["vpcZoneIdentifiers"] == subnets[1:]


def test_an_efa_group_takes_the_first_zone_that_offers_its_type():
    settings = with_efa(load_stack("staging"))
    unoffered = {settings.serving_group.instance_type: {zone(settings, 0)}}
    graph = run_program(settings, unoffered=unoffered)
    assert serving_asg(graph).inputs["vpcZoneIdentifiers"] == graph.outputs["private_subnet_ids"][1:2]


def test_a_type_no_zone_of_the_stack_offers_is_refused_naming_where_it_is_offered():
    settings = load_stack("staging")
    used = settings.network.availability_zones
    unoffered = {settings.serving_group.instance_type: {zone(settings, i) for i in range(used)}}
    with pytest.raises(ProvisionError) as refused:
        run_program(settings, unoffered=unoffered)
    [line] = [line for line in str(refused.value).splitlines() if "instance_type" in line]
    assert f"node_groups[0].instance_type = '{settings.serving_group.instance_type}': not offered" in line
    assert f"offered in {zone(settings, used)}" in line


def test_a_zero_gpu_quota_is_refused_naming_the_quota_and_the_vcpus_needed():
    settings = load_stack("dev")
    group = settings.serving_group
    with pytest.raises(ProvisionError) as refused:
        run_program(settings, vcpu_quotas={"L-DB2E81BA": 0})
    [line] = [line for line in str(refused.value).splitlines() if "L-DB2E81BA" in line]
    needed = group.max_size * 4  # g5.xlarge: 4 vCPUs
    assert (
        f"EC2 quota L-DB2E81BA (Running On-Demand G and VT instances) in {settings.region} is 0 vCPUs" in line
    )
    assert f"need {needed} at max_size ({group.name}: {group.max_size} x {group.instance_type})" in line
    assert f"--desired-value {needed}" in line


def test_a_quota_that_admits_max_size_is_enough():
    settings = load_stack("dev")
    group = settings.serving_group
    run_program(settings, vcpu_quotas={"L-DB2E81BA": group.max_size * 4})


def test_an_eks_node_pool_takes_only_the_zones_offering_every_type_it_may_launch():
    settings = load_stack("eks-prod")
    pool = settings.kubernetes.node_pools[0]
    unoffered = {pool.instance_types[0]: {zone(settings, 0)}}
    graph = run_kubernetes(settings, unoffered=unoffered)
    groups = {g.inputs["nodeGroupName"]: g for g in graph.of_type("aws:eks/nodeGroup:NodeGroup")}
    every_zone = groups[f"{settings.stack}-system"].inputs["subnetIds"]  # CPU nodes: every private subnet
    assert len(every_zone) == settings.network.availability_zones
    assert groups[f"{settings.stack}-{pool.name}"].inputs["subnetIds"] == every_zone[1:]


def test_an_eks_node_pool_no_zone_can_launch_is_refused_naming_the_pool():
    settings = load_stack("eks-prod")
    pool = settings.kubernetes.node_pools[0]
    zones = {zone(settings, i) for i in range(settings.network.availability_zones)}
    with pytest.raises(ProvisionError) as refused:
        run_kubernetes(settings, unoffered={pool.instance_types[0]: zones})
    [line] = [line for line in str(refused.value).splitlines() if "node_pools" in line]
    assert f"kubernetes.node_pools[0] ({pool.name}): no availability zone of the stack" in line
