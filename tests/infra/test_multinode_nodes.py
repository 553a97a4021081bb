"""A node group whose replica spans several nodes: its doors, its hosts' user data (Pulumi mocks).

The stack is ``stacks/Pulumi.prod-multinode.yaml`` (405B over 2 x p5.48xlarge per replica). The
doors are checked on a variant whose ``efa`` is off and whose
ranks (tensor 4 x pipeline 2) would fit one node's 8 GPUs, so what opens them is the replica
spanning nodes (``runtime.nodes_per_replica: 2``) and nothing else.
"""

from __future__ import annotations

import base64
import json

import pytest
from frontier_hostside.names import LEADER_PROXY_UNIT, NODES_PER_REPLICA_ENV
from infra_mocks import graph_for, run_program

from frontier.config.schema import Settings
from frontier.targets import load_stack

INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"


def spread_thin() -> Settings:
    """prod-multinode with 4 of each node's 8 GPUs per rank group and no EFA asked for."""
    settings = load_stack("prod-multinode")
    group = settings.node_groups[0].model_copy(update={"efa": False})
    runtime = settings.runtime.model_copy(update={"tensor_parallel_size": 4})
    return settings.model_copy(update={"node_groups": (group, *settings.node_groups[1:]), "runtime": runtime})


_graphs: dict[str, object] = {}


@pytest.fixture
def spanning():
    if "spanning" not in _graphs:
        _graphs["spanning"] = run_program(spread_thin())
    return _graphs["spanning"]


def self_rules(graph, typ: str) -> list:
    runtime = graph.one("aws:ec2/securityGroup:SecurityGroup", f"{graph.stack}-sg-runtime").id
    return [
        r
        for r in graph.of_type(typ)
        if r.inputs.get("securityGroupId") == runtime and r.inputs.get("referencedSecurityGroupId") == runtime
    ]


def test_a_group_whose_replica_spans_nodes_admits_all_traffic_from_its_own_security_group(spanning) -> None:
    [ingress] = self_rules(spanning, INGRESS)
    [egress] = self_rules(spanning, EGRESS)
    # All protocols: the step and store ports, gloo's and NCCL's ephemeral ports, EFA's own traffic.
    assert ingress.inputs["ipProtocol"] == egress.inputs["ipProtocol"] == "-1"
    assert "cidrIpv4" not in ingress.inputs and "cidrIpv4" not in egress.inputs


def test_a_group_whose_replica_fits_one_node_has_no_self_rule() -> None:
    prod = graph_for("prod")
    assert self_rules(prod, INGRESS) == [] and self_rules(prod, EGRESS) == []


def test_the_runtime_hosts_take_nothing_else_when_a_replica_spans_nodes(spanning) -> None:
    single = {r.name.removeprefix("prod-") for r in graph_for("prod").of_type(INGRESS)}
    spread = {r.name.removeprefix("prod-multinode-") for r in spanning.of_type(INGRESS)}
    assert spread - single == {"sg-runtime-efa-in"}


def test_a_group_whose_replica_spans_nodes_lives_in_one_cluster_placement_group(spanning) -> None:
    [placement] = spanning.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert placement.inputs["strategy"] == "cluster"


def test_the_hosts_of_a_spanning_group_boot_with_the_replica_size_and_the_leader_proxy(spanning) -> None:
    [template] = spanning.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    user_data = base64.b64decode(template.inputs["userData"]).decode()
    assert f"{NODES_PER_REPLICA_ENV}=2" in user_data
    assert f"/etc/systemd/system/{LEADER_PROXY_UNIT}.service" in user_data


def test_a_spanning_group_scales_on_queue_depth_a_whole_replica_at_a_time(spanning) -> None:
    policies = {p.name: p.inputs for p in spanning.of_type("aws:autoscaling/policy:Policy")}
    assert all(p["policyType"] == "StepScaling" for p in policies.values())
    steps = sorted(p["stepAdjustments"][0]["scalingAdjustment"] for p in policies.values())
    assert steps == [-2, 2, 2]  # in on load, out on the queue and out on TTFT p90
    alarms = {a.name: a.inputs for a in spanning.of_type("aws:cloudwatch/metricAlarm:MetricAlarm")}
    out = alarms["prod-multinode-h100x2-queue-depth-out"]
    assert (out["metricName"], out["statistic"], out["threshold"]) == ("QueueDepth", "Average", 16)


def test_a_single_node_group_keeps_its_target_tracking_out_and_steps_in_a_host_at_a_time() -> None:
    policies = graph_for("prod").of_type("aws:autoscaling/policy:Policy")
    [tracking] = [p.inputs for p in policies if p.inputs["policyType"] == "TargetTrackingScaling"]
    assert tracking["targetTrackingConfiguration"]["disableScaleIn"] is True
    steps = {p.name: p.inputs for p in policies if p.inputs["policyType"] == "StepScaling"}
    assert {name: step["stepAdjustments"][0]["scalingAdjustment"] for name, step in steps.items()} == {
        "prod-h100-load-in": -1,
        "prod-h100-ttft-out": 1,
    }


def runtime_statements(graph) -> dict[str, dict]:
    document = graph.one("aws:iam/rolePolicy:RolePolicy", f"{graph.stack}-iam-runtime").inputs["policy"]
    return {s["Sid"]: s for s in json.loads(document)["Statement"]}


def test_the_hosts_of_a_spanning_stack_may_claim_slots_under_the_replicas_prefix_only(spanning) -> None:
    statements = runtime_statements(spanning)
    history = f"arn:aws:s3:::{spanning.outputs['history_bucket']}/history/prod-multinode"
    assert statements["ClaimItsReplicaSlot"]["Action"] == ["s3:GetObject", "s3:PutObject"]
    assert statements["ClaimItsReplicaSlot"]["Resource"] == f"{history}/replicas/*"
    prefixes = statements["ListTheReplicaSlots"]["Condition"]["StringLike"]["s3:prefix"]
    assert prefixes == ["history/prod-multinode/replicas", "history/prod-multinode/replicas/*"]


def test_the_hosts_of_a_single_node_stack_get_no_replica_slot_grants() -> None:
    statements = runtime_statements(graph_for("prod"))
    assert "ClaimItsReplicaSlot" not in statements and "ListTheReplicaSlots" not in statements
