"""Spot and Capacity Blocks on EC2 under Pulumi mocks (no AWS API here): the node group's
MixedInstancesPolicy, the EventBridge rule and its queue, and a Capacity Block's targeting and
hand-over to its fallback group. The settings' own rules are in tests/unit/test_group_capacity.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frontier.targets import load_stack
from infra.interruptions import CAPACITY_BLOCK_WARNING, REBALANCE_RECOMMENDATION, SPOT_WARNING, queue_name
from tests.infra.infra_mocks import Graph, run_program
from tests.unit.conftest import edit_stack_file

ASG = "aws:autoscaling/group:Group"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
QUEUE = "aws:sqs/queue:Queue"
QUEUE_POLICY = "aws:sqs/queuePolicy:QueuePolicy"
RULE = "aws:cloudwatch/eventRule:EventRule"
TARGET = "aws:cloudwatch/eventTarget:EventTarget"
SCHEDULE = "aws:autoscaling/schedule:Schedule"
# The notices' rule and target, by name: the stack has other EventBridge rules (the synthetic
# probe's schedule).
NOTICE_RULE = "prod-interruptions-rule"
NOTICE_TARGET = "prod-interruptions-target"

SPOT = {
    "market": "spot",
    "on_demand_base": 2,
    "on_demand_above_base_percent": 0,
}
BLOCK = {
    "market": "capacity-block",
    "reservation_id": "cr-0123456789abcdef0",
    "end_time": "2027-01-15T11:30:00Z",
    "fallback_group": "h100-od",
}


def _fallback_group(document_group: dict) -> dict:
    return {
        **document_group,
        "name": "h100-od",
        "min_size": 1,
        "desired_size": 1,
        "max_size": 8,
        "schedule": None,
    }


def program(tmp_path: Path, group_changes: dict, second_group: bool = False) -> Graph:
    import shutil

    import yaml

    from frontier import project

    stacks = tmp_path / "stacks"
    shutil.copytree(project.root() / "stacks", stacks, ignore=shutil.ignore_patterns("baselines"))
    path = stacks / "Pulumi.prod.yaml"
    if second_group:
        document = yaml.safe_load(path.read_text())
        groups = document["config"]["frontier:node_groups"]
        groups.append({k: v for k, v in _fallback_group(groups[0]).items() if v is not None})
        path.write_text(yaml.safe_dump(document, sort_keys=False))
    edit_stack_file(path, {f"node_groups[0].{k}": v for k, v in group_changes.items()})
    return run_program(load_stack("prod", path=path))


@pytest.fixture(scope="module")
def spot(tmp_path_factory) -> Graph:
    return program(tmp_path_factory.mktemp("spot"), {"capacity": SPOT})


def test_a_spot_group_gets_an_on_demand_base_and_spot_above_it_capacity_optimized(spot):
    asg = spot.one(ASG)
    policy = asg.inputs["mixedInstancesPolicy"]
    distribution = policy["instancesDistribution"]
    assert distribution["onDemandBaseCapacity"] == 2
    assert distribution["onDemandPercentageAboveBaseCapacity"] == 0
    assert distribution["spotAllocationStrategy"] == "capacity-optimized"
    assert "launchTemplate" not in asg.inputs  # the policy's template replaces the group's own
    template = spot.one(TEMPLATE)
    spec = policy["launchTemplate"]["launchTemplateSpecification"]
    assert spec["launchTemplateId"] == template.id
    assert [o["instanceType"] for o in policy["launchTemplate"]["overrides"]] == ["p5.48xlarge"]
    assert asg.inputs["capacityRebalance"] is True


def test_several_types_with_the_same_gpus_become_the_policys_overrides(tmp_path):
    graph = program(tmp_path, {"instance_type": "p5e.48xlarge", "gpu_type": "H200-SXM-141GB", "gpu_memory_gb": 141,
                               "capacity": {**SPOT, "instance_types": ["p5en.48xlarge"]}})  # fmt: skip
    overrides = graph.one(ASG).inputs["mixedInstancesPolicy"]["launchTemplate"]["overrides"]
    assert [o["instanceType"] for o in overrides] == ["p5e.48xlarge", "p5en.48xlarge"]


def test_spot_and_rebalance_warnings_go_to_the_stacks_queue_through_one_rule(spot):
    queue = spot.one(QUEUE)
    assert queue.inputs["name"] == queue_name("prod") and queue.inputs["sqsManagedSseEnabled"] is True
    rule = spot.one(RULE, NOTICE_RULE)
    pattern = json.loads(rule.inputs["eventPattern"])
    assert pattern["source"] == ["aws.ec2"]
    assert set(pattern["detail-type"]) == {SPOT_WARNING, REBALANCE_RECOMMENDATION, CAPACITY_BLOCK_WARNING}
    target = spot.one(TARGET, NOTICE_TARGET)
    assert target.inputs["rule"] == rule.outputs["name"] and target.inputs["arn"] == queue.outputs["arn"]


def test_only_the_stacks_rule_may_send_to_the_queue_and_the_target_waits_for_that_grant(spot):
    policy = json.loads(spot.one(QUEUE_POLICY).inputs["policy"])
    (statement,) = policy["Statement"]
    assert statement["Principal"] == {"Service": "events.amazonaws.com"}
    assert statement["Action"] == "sqs:SendMessage"
    assert statement["Resource"] == spot.one(QUEUE).outputs["arn"]
    assert statement["Condition"]["ArnEquals"]["aws:SourceArn"] == spot.one(RULE, NOTICE_RULE).outputs["arn"]
    assert spot.one(QUEUE_POLICY).inputs["queueUrl"] == spot.one(QUEUE).outputs["url"]
    assert spot.one(QUEUE_POLICY).urn in spot.one(TARGET, NOTICE_TARGET).dependencies


def test_an_on_demand_stack_has_no_mixed_policy_and_no_notice_queue(prod):
    asg = prod.one(ASG)
    assert asg.inputs.get("mixedInstancesPolicy") is None and "launchTemplate" in asg.inputs
    assert all(r.inputs.get("name") != queue_name("prod") for r in prod.of_type(QUEUE, RULE))
    assert prod.of_type(TARGET, QUEUE_POLICY) == [] or all(
        "interruptions" not in r.name for r in prod.of_type(TARGET, QUEUE_POLICY)
    )


@pytest.fixture(scope="module")
def block(tmp_path_factory) -> Graph:
    return program(tmp_path_factory.mktemp("block"), {"capacity": BLOCK, "schedule": None}, second_group=True)


def test_a_capacity_block_group_targets_its_reservation_with_the_capacity_block_market(block):
    templates = {r.name: r.inputs for r in block.of_type(TEMPLATE)}
    inputs = templates["prod-h100-lt"]
    assert inputs["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert inputs["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}
    }
    fallback = templates["prod-h100-od-lt"]
    assert "instanceMarketOptions" not in fallback and "capacityReservationSpecification" not in fallback


def test_forty_minutes_before_the_block_ends_its_group_drains_and_the_fallback_takes_its_size(block):
    actions = {r.inputs["scheduledActionName"]: r.inputs for r in block.of_type(SCHEDULE)}
    drain, rise = actions["h100-capacity-block-ends"], actions["h100-capacity-block-fallback"]
    assert drain["startTime"] == rise["startTime"] == "2027-01-15T10:50:00Z"
    assert (drain["minSize"], drain["maxSize"], drain["desiredCapacity"]) == (0, 0, 0)
    asgs = {r.name: r for r in block.of_type(ASG)}
    assert drain["autoscalingGroupName"] == asgs["prod-h100-asg"].outputs["name"]
    assert rise["autoscalingGroupName"] == asgs["prod-h100-od-asg"].outputs["name"]
    # The block's six hosts move to the fallback (its max_size is 8); its maximum stays its own.
    assert (rise["minSize"], rise["desiredCapacity"], rise["maxSize"]) == (6, 6, -1)


def test_the_fallback_group_boots_the_blocks_pool_and_joins_its_target_group(block):
    asgs = {r.name: r.inputs for r in block.of_type(ASG)}
    assert asgs["prod-h100-od-asg"]["targetGroupArns"] == asgs["prod-h100-asg"]["targetGroupArns"] != []
    (pool,) = block.settings.pools_on(block.settings.node_groups[1])
    assert pool is block.settings.only_pool


# -- who reads the queue ----------------------------------------------------------------------------

DEPLOY_ROLE = "aws:iam/role:Role"
DEPLOY_POLICY = "aws:iam/rolePolicy:RolePolicy"


def _deploy_decisions(graph: Graph, calls: list[tuple[str, str]]) -> list[str]:
    """What AWS decides for the deploy role's ``(action, resource)`` calls, conditions evaluated
    (``@cloud-copilot/iam-simulate``)."""
    from tests.e2e.iam_simulation import role_decisions

    role = graph.one(DEPLOY_ROLE, f"{graph.stack}-iam-deploy").outputs["arn"]
    document = json.loads(graph.one(DEPLOY_POLICY, f"{graph.stack}-iam-deploy").inputs["policy"])
    return role_decisions(role, document, calls)


def test_the_deploy_role_reads_the_notices_on_its_stacks_queue_as_fab_status_does(spot):
    queue = spot.one(QUEUE).outputs["arn"]
    assert (
        _deploy_decisions(spot, [("sqs:GetQueueUrl", queue), ("sqs:ReceiveMessage", queue)])
        == ["Allowed"] * 2
    )


def test_the_deploy_role_can_neither_take_send_nor_purge_notices_nor_read_another_stacks_queue(spot):
    queue = spot.one(QUEUE).outputs["arn"]
    other = queue.replace(queue_name("prod"), queue_name("staging"))
    calls = [
        ("sqs:DeleteMessage", queue),
        ("sqs:ChangeMessageVisibility", queue),
        ("sqs:SendMessage", queue),
        ("sqs:PurgeQueue", queue),
        ("sqs:ReceiveMessage", other),
        ("sqs:GetQueueUrl", other),
    ]
    assert _deploy_decisions(spot, calls) == ["ImplicitlyDenied"] * len(calls)


def test_an_on_demand_stacks_deploy_role_has_no_queue_to_read(prod):
    document = json.loads(prod.one(DEPLOY_POLICY, "prod-iam-deploy").inputs["policy"])
    actions = [
        a
        for s in document["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    ]
    assert not [a for a in actions if a.startswith("sqs:")]
