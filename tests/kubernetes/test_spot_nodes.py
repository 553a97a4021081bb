"""Spot nodes on Kubernetes: the Node Termination Handler in queue mode installed with the add-ons,
the GPU node group bought as spot, and pods that drain within the two-minute notice (the Pulumi
program under mocks; the objects validated with kubernetes-validate --strict)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from frontier import project
from frontier.config.purchase import notice_queue_name
from frontier.config.schema import Settings
from frontier.errors import StackError
from frontier.targets import load_stack
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes.interruption import SPOT_NOTICE_S, termination_budget_s

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "infra"))
from infra.addons import CHARTS, NTH_SERVICE_ACCOUNT  # noqa: E402
from infra.interruptions import SPOT_WARNING  # noqa: E402
from tests.infra.k8s_mocks import run_kubernetes  # noqa: E402

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
DIGEST = "sha256:" + "ab" * 32
SPOT = {"market": "spot"}


def eks_variant(tmp_path: Path, capacity: dict | None, **config: Any) -> Path:
    """eks-prod with its GPU group's capacity and top-level sections changed (``rollout.x`` names a field)."""
    document = yaml.safe_load((project.stacks_dir() / "Pulumi.eks-prod.yaml").read_text())
    cfg = document["config"]
    if capacity is not None:
        cfg["frontier:node_groups"][0]["capacity"] = capacity
    for key, value in config.items():
        section, field = key.split(".")
        cfg[f"frontier:{section}"][field] = value
    path = tmp_path / "Pulumi.eks-prod.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def spot_settings(tmp_path: Path) -> Settings:
    # 30 s preStop + 60 s drain + 15 s margin = 105 s: within the 110 s a spot node leaves a pod.
    return load_stack("eks-prod", path=eks_variant(tmp_path, SPOT, **{"rollout.deregistration_delay_s": 30}))


@pytest.fixture(scope="module")
def spot(tmp_path_factory):
    return run_kubernetes(spot_settings(tmp_path_factory.mktemp("spot")))


def _release(graph, key: str):
    return next(r for r in graph.of_type(HELM_RELEASE) if r.inputs["name"] == key)


def test_the_termination_handler_runs_in_queue_mode_on_the_stacks_notice_queue(spot):
    release = _release(spot, "node-termination-handler")
    chart = CHARTS["node-termination-handler"]
    assert (release.inputs["chart"], release.inputs["version"]) == (chart.chart, chart.version)
    assert release.inputs["namespace"] == "kube-system" and release.inputs["atomic"] is True
    values = release.inputs["values"]
    queue = next(
        q for q in spot.of_type("aws:sqs/queue:Queue") if q.inputs["name"] == notice_queue_name("eks-prod")
    )
    assert values["enableSqsTerminationDraining"] is True
    assert values["queueURL"] == queue.outputs["url"]
    assert values["podTerminationGracePeriod"] == -1  # each pod's own, sized to the notice
    rule = next(
        r
        for r in spot.of_type("aws:cloudwatch/eventRule:EventRule")
        if r.inputs["name"] == notice_queue_name("eks-prod")
    )
    assert SPOT_WARNING in json.loads(rule.inputs["eventPattern"])["detail-type"]


def test_the_termination_handler_may_read_and_delete_only_the_stacks_notices(spot):
    policy = json.loads(
        next(r for r in spot.of_type("aws:iam/rolePolicy:RolePolicy") if r.name.endswith("-nth")).inputs[
            "policy"
        ]
    )
    statements = {s["Sid"]: s for s in policy["Statement"]}
    queue = next(
        q for q in spot.of_type("aws:sqs/queue:Queue") if q.inputs["name"] == notice_queue_name("eks-prod")
    )
    assert statements["NoticeQueue"]["Resource"] == queue.outputs["arn"]
    assert set(statements["NoticeQueue"]["Action"]) == {"sqs:ReceiveMessage", "sqs:DeleteMessage"}
    assert not any("sqs:" in a for a in statements["FindTheNode"]["Action"])
    association = next(
        r
        for r in spot.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
        if r.name.endswith("-nth")
    )
    assert association.inputs["serviceAccount"] == NTH_SERVICE_ACCOUNT
    assert association.urn in _release(spot, "node-termination-handler").dependencies


def test_the_spot_groups_nodes_are_bought_as_spot_over_its_same_gpu_types(spot):
    gpu = next(r for r in spot.of_type(NODE_GROUP) if r.inputs.get("capacityType"))
    assert gpu.inputs["capacityType"] == "SPOT"
    assert gpu.inputs["instanceTypes"] == ["p5.48xlarge"]


def test_an_on_demand_cluster_gets_no_termination_handler_and_no_spot_nodes(tmp_path):
    graph = run_kubernetes(load_stack("eks-prod"))
    assert all(r.inputs["name"] != "node-termination-handler" for r in graph.of_type(HELM_RELEASE))
    assert all(not r.inputs.get("capacityType") for r in graph.of_type(NODE_GROUP))


def test_pods_on_spot_nodes_terminate_within_the_notice_and_each_pool_has_a_budget(tmp_path):
    settings = spot_settings(tmp_path)
    workload = m.render_workload(settings, DIGEST)
    version = settings.kubernetes.cluster.version
    core = [d.to_dict() for d in workload.all() if d.kind in ("Deployment", "PodDisruptionBudget")]
    for manifest in core:
        kubernetes_validate.validate(manifest, version, strict=True)
    deployment = next(
        d.to_dict() for d in workload.all() if d.kind == "Deployment" and "gateway" not in d.name
    )
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] <= termination_budget_s() < SPOT_NOTICE_S
    assert pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "30"]
    budgets = [d.to_dict() for d in workload.all() if d.kind == "PodDisruptionBudget"]
    assert len(budgets) >= len(settings.pools) and all(b["spec"]["maxUnavailable"] >= 1 for b in budgets)


def test_a_termination_longer_than_the_notice_is_refused_naming_its_parts(tmp_path):
    with pytest.raises(StackError) as err:
        load_stack("eks-prod", path=eks_variant(tmp_path, SPOT))  # 90 s preStop + 60 s drain + 15 s
    message = str(err.value)
    assert "rollout.deregistration_delay_s" in message and "90" in message
    assert "takes up to 165 s" in message and "at most 110 s" in message and "drain_timeout_s (60)" in message


def test_an_on_demand_base_on_a_spot_node_group_is_refused_on_kubernetes(tmp_path):
    path = eks_variant(tmp_path, {**SPOT, "on_demand_base": 1}, **{"rollout.deregistration_delay_s": 30})
    with pytest.raises(StackError) as err:
        load_stack("eks-prod", path=path)
    assert "node_groups[0].capacity.on_demand_base" in str(err.value) and "all spot" in str(err.value)


def test_a_capacity_block_is_refused_on_kubernetes(tmp_path):
    path = eks_variant(tmp_path, None)
    document = yaml.safe_load(path.read_text())
    groups = document["config"]["frontier:node_groups"]
    groups.append({**groups[0], "name": "h100-od"})
    groups[0]["capacity"] = {"market": "capacity-block", "reservation_id": "cr-0123456789abcdef0",
                             "end_time": "2027-01-15T11:30:00Z", "fallback_group": "h100-od"}  # fmt: skip
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(StackError) as err:
        load_stack("eks-prod", path=path)
    message = str(err.value)
    assert "node_groups[0].capacity.market" in message and "EC2 node groups only" in message
