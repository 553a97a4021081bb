"""Under Pulumi mocks (no AWS here): where the ALB fronts a group that buys spot, the stack makes the
function that takes a warned host out of the target groups (``infra/out_of_service.py``), invoked
by a rule of spot warnings alone, with a role that may deregister from this stack's groups and
nothing else. What the function does against a real API is in tests/operate/test_spot_out_of_service.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from frontier import project
from frontier.targets import load_stack
from infra.functions import out_of_service as oos
from infra.interruptions import CAPACITY_BLOCK_WARNING, REBALANCE_RECOMMENDATION
from infra.out_of_service import function_name, needs_out_of_service
from tests.e2e import ec2_actors
from tests.infra.infra_mocks import Graph, run_program
from tests.infra.test_spot_capacity import SPOT
from tests.unit.conftest import edit_stack_file

FUNCTION = "aws:lambda/function:Function"
PERMISSION = "aws:lambda/permission:Permission"
RULE = "aws:cloudwatch/eventRule:EventRule"
TARGET = "aws:cloudwatch/eventTarget:EventTarget"
ROLE = "aws:iam/role:Role"
POLICY = "aws:iam/rolePolicy:RolePolicy"
TARGET_GROUP = "aws:lb/targetGroup:TargetGroup"
NAME = "prod-out-of-service"


def prod(tmp_path: Path, changes: dict) -> Graph:
    stacks = tmp_path / "stacks"
    shutil.copytree(project.root() / "stacks", stacks, ignore=shutil.ignore_patterns("baselines"))
    path = edit_stack_file(stacks / "Pulumi.prod.yaml", changes)
    return run_program(load_stack("prod", path=path))


@pytest.fixture(scope="module")
def spot(tmp_path_factory) -> Graph:
    return prod(tmp_path_factory.mktemp("spot"), {"node_groups[0].capacity": SPOT})


@pytest.fixture(scope="module")
def stepped(tmp_path_factory) -> Graph:
    """Spot hosts rolled by traffic share: a canary target group beside the API's."""
    return prod(
        tmp_path_factory.mktemp("stepped"),
        {"node_groups[0].capacity": SPOT, "rollout.traffic_steps": [25, 50, 100]},
    )


def _function(graph: Graph):  # noqa: ANN202
    return graph.one(FUNCTION, f"{NAME}-function")


def _groups(graph: Graph) -> list[str]:
    return [g.outputs["arn"] for g in graph.of_type(TARGET_GROUP)]


def test_spot_warnings_alone_invoke_the_function(spot):
    rule = spot.one(RULE, f"{NAME}-rule")
    pattern = json.loads(rule.inputs["eventPattern"])
    assert pattern == {"source": ["aws.ec2"], "detail-type": [oos.SPOT_WARNING]}
    assert not {REBALANCE_RECOMMENDATION, CAPACITY_BLOCK_WARNING} & set(pattern["detail-type"])
    function = _function(spot)
    assert (
        function.inputs["name"] == function_name("prod")
        and function.inputs["handler"] == "out_of_service.handler"
    )
    target = spot.one(TARGET, f"{NAME}-target")
    assert target.inputs["rule"] == rule.outputs["name"] and target.inputs["arn"] == function.outputs["arn"]


def test_only_its_rule_may_invoke_it_and_the_rule_waits_for_that_grant(spot):
    permission = spot.one(PERMISSION, f"{NAME}-rule")
    assert permission.inputs["principal"] == "events.amazonaws.com"
    assert permission.inputs["sourceArn"] == spot.one(RULE, f"{NAME}-rule").outputs["arn"]
    assert permission.inputs["function"] == _function(spot).outputs["name"]
    assert permission.urn in spot.one(TARGET, f"{NAME}-target").dependencies


def test_the_function_names_the_apis_target_group(spot):
    variables = _function(spot).inputs["environment"]["variables"]
    assert variables[oos.TARGET_GROUPS_ENV].split(",") == _groups(spot)


def test_a_stack_rolled_by_traffic_share_names_its_canary_group_too(stepped):
    variables = _function(stepped).inputs["environment"]["variables"]
    assert len(_groups(stepped)) == 2
    assert sorted(variables[oos.TARGET_GROUPS_ENV].split(",")) == sorted(_groups(stepped))


def _decisions(graph: Graph, calls: list[tuple[str, str]]) -> list[str]:
    from tests.e2e.iam_simulation import role_decisions

    role = graph.one(ROLE, f"{NAME}-role").outputs["arn"]
    return role_decisions(role, json.loads(graph.one(POLICY, f"{NAME}-role").inputs["policy"]), calls)


def test_its_role_may_deregister_from_the_stacks_groups_and_nothing_more(stepped):
    main, canary = _groups(stepped)
    foreign = main.replace("prod-", "staging-")
    allowed = [
        ("elasticloadbalancing:DeregisterTargets", main),
        ("elasticloadbalancing:DeregisterTargets", canary),
        ("elasticloadbalancing:DescribeTargetHealth", "*"),
    ]
    denied = [
        ("elasticloadbalancing:DeregisterTargets", foreign),
        ("elasticloadbalancing:RegisterTargets", main),
        ("elasticloadbalancing:ModifyTargetGroup", main),
        ("autoscaling:TerminateInstanceInAutoScalingGroup", "*"),
    ]
    assert _decisions(stepped, allowed + denied) == ["Allowed"] * 3 + ["ImplicitlyDenied"] * 4


def test_an_on_demand_stack_makes_no_such_function():
    graph = run_program(load_stack("prod"))
    assert not [f for f in graph.of_type(FUNCTION) if f.name == f"{NAME}-function"]


def test_behind_a_gateway_the_agent_tells_the_gateway_and_no_function_is_made(tmp_path):
    # The ALB's targets are then the gateway's hosts, which take no spot notice of a runtime's.
    settings = ec2_actors.write_prod_stack(tmp_path / "stacks")
    assert settings.gateway is not None and settings.node_groups[0].capacity is not None
    assert not needs_out_of_service(settings)


def test_its_logs_are_kept_encrypted_with_the_stacks_key_for_the_stacks_retention(spot):
    logs = spot.one("aws:cloudwatch/logGroup:LogGroup", f"{NAME}-logs")
    assert logs.inputs["name"] == f"/aws/lambda/{function_name('prod')}"
    assert logs.inputs["kmsKeyId"] and logs.inputs["retentionInDays"] >= 30


def test_pulumi_up_as_the_language_host_runs_it_declares_the_function_its_rule_and_the_grant(tmp_path):
    # A fresh interpreter, cwd infra/, runpy.run_path("."), the stack's config in PULUMI_CONFIG.
    import yaml
    from test_language_host import declared

    document = yaml.safe_load((project.root() / "stacks" / "Pulumi.prod.yaml").read_text())
    document["config"]["frontier:node_groups"][0]["capacity"] = SPOT
    run = declared("prod", document, tmp_path)
    names_of = {(typ, resource): name for typ, resource, name in run["named"]}
    assert names_of[(FUNCTION, f"{NAME}-function")] == function_name("prod")
    assert names_of[(RULE, f"{NAME}-rule")] == function_name("prod")
    assert (PERMISSION, f"{NAME}-rule") in {tuple(r) for r in run["resources"]}
    assert (TARGET, f"{NAME}-target") in {tuple(r) for r in run["resources"]}
