"""GPU hosts go where the region offers their type, within the account's vCPU quotas, or the stack is
refused before anything is created (one line naming the zone or the quota)."""

from __future__ import annotations

import pytest
from infra_mocks import run_program
from k8s_mocks import run_kubernetes

from frontier.config.purchase import SpotCapacity
from frontier.config.schema import Settings
from frontier.targets import load_stack
from infra.errors import ProvisionError
from infra.placement import ON_DEMAND_VCPU_QUOTAS, SPOT_VCPU_QUOTAS, market_shares, quota_of

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


def with_spot(settings: Settings, *, max_size: int, base: int, percent: int) -> Settings:
    """The serving group buying spot above an on-demand base, and ``percent`` on-demand above it."""
    spot = SpotCapacity(market="spot", on_demand_base=base, on_demand_above_base_percent=percent)
    group = settings.serving_group.model_copy(update={"capacity": spot, "max_size": max_size})
    return settings.model_copy(update={"node_groups": (group,)})


def test_spot_hosts_count_against_their_familys_spot_vcpu_quota():
    assert quota_of("g6e.12xlarge", spot=True) == SPOT_VCPU_QUOTAS["g"]
    assert quota_of("g5.xlarge", spot=True).code == "L-3819A6DF"
    assert quota_of("vt1.3xlarge", spot=True).code == "L-3819A6DF"
    assert quota_of("p5.48xlarge", spot=True).code == "L-7212CCBC"
    assert quota_of("c7i.4xlarge", spot=True) is None


def test_a_groups_on_demand_share_is_its_base_and_its_percentage_above_rounded_up_the_rest_spot():
    group = with_spot(load_stack("dev"), max_size=5, base=1, percent=25).serving_group
    assert market_shares(group) == (2, 3)  # 1 + ceil(4 x 25 %) on-demand
    all_spot = with_spot(load_stack("dev"), max_size=4, base=0, percent=0).serving_group
    assert market_shares(all_spot) == (0, 4)
    assert market_shares(load_stack("dev").serving_group) == (2, 0)  # no capacity section: on-demand


def test_the_program_asks_for_the_spot_quota_of_a_group_that_buys_spot():
    graph = run_program(with_spot(load_stack("dev"), max_size=5, base=1, percent=25))
    assert sorted(args["quotaCode"] for token, args in graph.invokes if token == QUOTA) == [
        "L-3819A6DF",
        "L-DB2E81BA",
    ]


def test_a_zero_spot_quota_is_refused_in_one_line_naming_it_and_the_groups_spot_share():
    settings = with_spot(load_stack("dev"), max_size=5, base=1, percent=25)
    group = settings.serving_group
    # The on-demand share (2 x 4 vCPUs) fits its quota: only the spot quota is short.
    with pytest.raises(ProvisionError) as refused:
        run_program(settings, vcpu_quotas={"L-DB2E81BA": 8, "L-3819A6DF": 0})
    problems = [line.strip() for line in str(refused.value).splitlines()[1:]]
    assert problems == [
        f"EC2 quota L-3819A6DF (All G and VT Spot Instance Requests) in {settings.region} is 0 vCPUs; the node "
        f"groups need 12 at max_size ({group.name}: 3 spot of 5 x g5.xlarge): request an increase (aws "
        "service-quotas request-service-quota-increase --service-code ec2 --quota-code L-3819A6DF "
        "--desired-value 12)"
    ]


def test_a_spot_group_short_of_both_quotas_gets_one_line_for_each():
    settings = with_spot(load_stack("dev"), max_size=5, base=1, percent=25)
    with pytest.raises(ProvisionError) as refused:
        run_program(settings, vcpu_quotas={"L-DB2E81BA": 4, "L-3819A6DF": 8})
    on_demand, spot = (line.strip() for line in str(refused.value).splitlines()[1:])
    assert on_demand.startswith("EC2 quota L-DB2E81BA (Running On-Demand G and VT instances)")
    assert "is 4 vCPUs; the node groups need 8 at max_size (a10g: 2 on-demand of 5 x g5.xlarge)" in on_demand
    assert spot.startswith("EC2 quota L-3819A6DF (All G and VT Spot Instance Requests)")
    assert "is 8 vCPUs; the node groups need 12 at max_size (a10g: 3 spot of 5 x g5.xlarge)" in spot


def test_a_group_all_on_spot_needs_no_on_demand_quota():
    settings = with_spot(load_stack("dev"), max_size=4, base=0, percent=0)
    run_program(settings, vcpu_quotas={"L-DB2E81BA": 0, "L-3819A6DF": 16})
