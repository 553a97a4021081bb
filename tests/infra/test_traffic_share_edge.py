"""An EC2 stack that rolls by traffic share (``rollout.traffic_steps``) with its ALB in front of its
runtimes: ``pulumi up`` gives it a canary target group beside the main one (same port, same health
check), the API's listener rule forwards to both by weight, all of it on the main group, the stack
exports both for ``fab``, and the deploy role may move hosts into that group and set that rule's
weights, nothing more. The program runs as the CLI's language host runs it, in a fresh process
(``language_host.py``); the five shipped EC2 stacks, which do not set the field, keep their graph.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from infra_mocks import run_program
from test_language_host import REPO, declared

from frontier.config.outputs import Ec2Outputs
from frontier.targets.ec2.balancer import FULL_WEIGHT

pytestmark = pytest.mark.slow

TARGET_GROUP = "aws:lb/targetGroup:TargetGroup"
LISTENER_RULE = "aws:lb/listenerRule:ListenerRule"
WEIGHTS_ACTIONS = {"elasticloadbalancing:ModifyRule", "elasticloadbalancing:DescribeRules"}


def produced(stack: str, tmp: Path, changes: dict[str, Any]) -> dict[str, Any]:
    """What the language host declares for ``stack`` with ``changes`` to its ``frontier:rollout``:
    ``test_language_host``'s run, over a copy of the stack file so changed (``$FRONTIER_STACKS_DIR``,
    where the program's loader reads it) and the matching ``PULUMI_CONFIG``."""
    document = yaml.safe_load((REPO / "stacks" / f"Pulumi.{stack}.yaml").read_text())
    config = document["config"]
    config["frontier:rollout"] = {**config["frontier:rollout"], **changes}
    variant = tmp / ("-".join(map(str, changes.get("traffic_steps", []))) or "shipped")
    variant.mkdir()
    return declared(stack, document, variant)


@cache
def runs(tmp: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """prod as shipped, and prod rolling by traffic share."""
    return produced("prod", Path(tmp), {}), produced("prod", Path(tmp), {"traffic_steps": [5, 25, 100]})


@pytest.fixture(scope="module")
def prod_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    return runs(str(tmp_path_factory.mktemp("traffic-share")))


def test_the_stack_gains_exactly_a_canary_target_group(prod_runs):
    shipped, weighted = prod_runs
    added = set(map(tuple, weighted["resources"])) - set(map(tuple, shipped["resources"]))
    assert added == {(TARGET_GROUP, "prod-edge-canary-tg")}
    assert set(map(tuple, shipped["resources"])) <= set(map(tuple, weighted["resources"]))


def test_both_target_groups_and_the_rule_are_exported_for_fab(prod_runs):
    shipped, weighted = prod_runs
    saved = Ec2Outputs[str].model_validate(weighted["outputs"])
    assert saved.canary_target_group_arn and saved.api_rule_arn
    assert saved.canary_target_group_arn != saved.target_group_arn
    assert Ec2Outputs[str].model_validate(shipped["outputs"]).canary_target_group_arn is None


def _deploy_statements(run: dict[str, Any]) -> list[dict[str, Any]]:
    (deploy,) = [w for w in run["whole"] if w["type"].endswith("RolePolicy") and "deploy" in w["resource"]]
    return json.loads(deploy["policy"])["Statement"]


def test_the_deploy_role_moves_hosts_into_the_canary_group_and_weighs_the_rule_alone(prod_runs):
    shipped, weighted = prod_runs
    saved = Ec2Outputs[str].model_validate(weighted["outputs"])
    added = [s for s in _deploy_statements(weighted) if s not in _deploy_statements(shipped)]
    by_sid = {s["Sid"]: s for s in added}
    assert set(by_sid) == {"MoveHostsIntoTheCanaryGroup", "WeighTheTwoGroups", "ReadTheWeights"}
    assert by_sid["MoveHostsIntoTheCanaryGroup"]["Resource"] == saved.canary_target_group_arn
    assert by_sid["WeighTheTwoGroups"]["Action"] == "elasticloadbalancing:ModifyRule"
    assert by_sid["WeighTheTwoGroups"]["Resource"] == saved.api_rule_arn
    shipped_actions = {a for s in _deploy_statements(shipped) for a in _listed(s["Action"])}
    assert not WEIGHTS_ACTIONS & shipped_actions


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def test_the_api_rule_forwards_by_weight_all_of_it_to_the_main_group_whose_health_check_the_canary_shares(
    prod,
):
    settings = prod.settings.model_copy(
        update={"rollout": prod.settings.rollout.model_copy(update={"traffic_steps": (5, 25, 100)})}
    )
    graph = run_program(settings)  # infra.program.build, the program's body, in this interpreter
    main, canary = graph.one(TARGET_GROUP, "prod-edge-tg"), graph.one(TARGET_GROUP, "prod-edge-canary-tg")
    shared = ("port", "protocol", "healthCheck", "deregistrationDelay", "slowStart", "vpcId")
    assert {k: canary.inputs.get(k) for k in shared} == {k: main.inputs.get(k) for k in shared}
    [action] = graph.one(LISTENER_RULE, "prod-edge-api").inputs["actions"]
    weights = {g["arn"]: g["weight"] for g in action["forward"]["targetGroups"]}
    assert weights == {main.outputs["arn"]: FULL_WEIGHT, canary.outputs["arn"]: 0}
