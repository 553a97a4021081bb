"""A disaggregated pool on EC2: dev behind its gateway, its model's prefill half on a group of its own
(``prefill``, 1 replica) and its decode half on dev's group (``a10g``, 2 replicas), the whole program
under Pulumi's mocks. Each half's hosts boot their role's runtime, scale on their own signal, and
talk KV transfer only one way: the decode hosts pull from the prefill hosts' listener."""

from __future__ import annotations

import base64
import copy
from pathlib import Path

import pytest
import yaml
from infra_mocks import Graph, run_program

from frontier.access.gateway import gateway_config
from frontier.errors import FrontierError
from frontier.render.boot import KV_ROLE_ENV
from frontier.render.host import render_release_files
from frontier.targets import load_stack
from infra.errors import ProvisionError
from tests.gateway.stacks import dev_gateway_document, write_stack

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"
POLICY = "aws:autoscaling/policy:Policy"
SG = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
DECODE, PREFILL = "a10g", "prefill"
TRANSFER_PORT = 5600  # runtime.kv_transfer.port's default
DIGEST = "sha256:" + "2" * 64


def document(prefill_replicas: int = 1, decode_replicas: int = 2, **runtime: object) -> dict:
    doc = dev_gateway_document()
    config = doc["config"]
    (group,) = config["frontier:node_groups"]
    config["frontier:node_groups"] = [group, {**copy.deepcopy(group), "name": PREFILL, "max_size": 3}]
    config["frontier:runtime"].update(prefix_caching=True, **runtime)
    config["frontier:disaggregation"] = {
        "prefill": {"node_group": PREFILL, "replicas": prefill_replicas},
        "decode": {"node_group": DECODE, "replicas": decode_replicas},
    }
    return doc


def build(tmp: Path, doc: dict) -> Graph:
    return run_program(load_stack("dev", path=write_stack(tmp, doc, "dev")))


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> Graph:
    return build(tmp_path_factory.mktemp("stacks"), document())


def user_data(graph: Graph, group: str) -> str:
    return base64.b64decode(graph.one(LAUNCH_TEMPLATE, f"dev-{group}-lt").inputs["userData"]).decode()


def test_each_half_is_a_group_of_its_own_started_at_its_replicas(graph):
    desired = {asg.name: asg.inputs["desiredCapacity"] for asg in graph.of_type(ASG)}
    assert desired[f"dev-{PREFILL}-asg"] == 1
    assert desired[f"dev-{DECODE}-asg"] == 2


def test_each_halfs_hosts_are_told_their_role_and_their_group(graph):
    for group, role in ((PREFILL, "prefill"), (DECODE, "decode")):
        text = user_data(graph, group)
        assert f"{KV_ROLE_ENV}={role}" in text
        assert f"FRONTIER_NODE_GROUP={group}" in text


def test_both_halves_run_one_release_each_host_in_the_role_its_node_env_names(graph):
    (pool,) = graph.settings.pools
    files = render_release_files(graph.settings, pool, DIGEST)
    assert sorted(files) == ["frontier-runtime.service", "runtime.yaml"]
    assert yaml.safe_load(files["runtime.yaml"])["kv_transfer"]["role"] == "both"
    unit = files["frontier-runtime.service"]
    assert "EnvironmentFile=/etc/frontier/node.env" in unit
    assert f"serve --config /etc/frontier/release/runtime.yaml --kv-role ${{{KV_ROLE_ENV}}}" in unit


def test_the_prefill_group_scales_out_on_prompts_waiting_and_the_decode_group_on_running_streams(graph):
    tracked = {
        p.name: p.inputs["targetTrackingConfiguration"]
        for p in graph.of_type(POLICY)
        if p.inputs.get("policyType") == "TargetTrackingScaling"
    }
    prefill = tracked[f"dev-{PREFILL}-queue-depth"]["customizedMetricSpecification"]
    decode = tracked[f"dev-{DECODE}-running"]["customizedMetricSpecification"]
    assert prefill["metricName"] == "QueueDepth"
    assert decode["metricName"] == "RunningRequests"
    assert {d["value"] for d in decode["metricDimensions"]} == {"dev", DECODE}
    (pool,) = graph.settings.pools
    group = pool.disaggregation.decode.group
    expected = pool.runtime.max_concurrency * group.scale_in_utilisation
    assert tracked[f"dev-{DECODE}-running"]["targetValue"] == pytest.approx(expected)
    assert f"dev-{DECODE}-queue-depth" not in tracked and f"dev-{PREFILL}-running" not in tracked
    # Scale-in stays the load rule's, a replica at a time, on each group.
    steps = {p.name for p in graph.of_type(POLICY) if p.inputs.get("policyType") == "StepScaling"}
    assert {f"dev-{PREFILL}-load-in", f"dev-{DECODE}-load-in"} <= steps


def test_the_prefill_group_also_scales_out_on_its_ttft_p90_and_the_decode_group_does_not(graph):
    alarms = {a.name for a in graph.of_type("aws:cloudwatch/metricAlarm:MetricAlarm")}
    assert f"dev-{PREFILL}-ttft-out" in alarms and f"dev-{DECODE}-ttft-out" not in alarms


def test_exactly_one_rule_opens_the_transfer_port_from_the_decode_hosts_to_the_prefill_hosts(graph):
    prefill_sg = graph.one(SG, f"dev-sg-kv-{PREFILL}").id
    decode_sg = graph.one(SG, f"dev-sg-kv-{DECODE}").id
    on_port = [r for r in graph.of_type(INGRESS) if r.inputs.get("fromPort") == TRANSFER_PORT]
    assert [(r.inputs["securityGroupId"], r.inputs["referencedSecurityGroupId"]) for r in on_port] == [
        (prefill_sg, decode_sg)
    ]
    out = [r for r in graph.of_type(EGRESS) if r.inputs.get("fromPort") == TRANSFER_PORT]
    assert [(r.inputs["securityGroupId"], r.inputs["referencedSecurityGroupId"]) for r in out] == [
        (decode_sg, prefill_sg)
    ]


def test_each_halfs_hosts_join_its_group_beside_the_runtime_group(graph):
    runtime = graph.one(SG, "dev-sg-runtime").id
    for group in (PREFILL, DECODE):
        template = graph.one(LAUNCH_TEMPLATE, f"dev-{group}-lt")
        assert template.inputs["networkInterfaces"][0]["securityGroups"] == [
            runtime,
            graph.one(SG, f"dev-sg-kv-{group}").id,
        ]


def test_both_halves_run_as_the_pools_one_principal(graph):
    profiles = {
        graph.one(LAUNCH_TEMPLATE, f"dev-{g}-lt").inputs["iamInstanceProfile"]["arn"]
        for g in (PREFILL, DECODE)
    }
    assert len(profiles) == 1


def test_the_gateway_finds_the_prefill_and_decode_replicas_each_on_its_group(graph):
    (model,) = gateway_config(graph.settings, None).models
    halves = model.disaggregation
    assert model.discovery is None and model.replicas == ()
    assert halves is not None and halves.prefill_discovery is not None and halves.decode_discovery is not None
    assert (halves.prefill_discovery.node_group, halves.decode_discovery.node_group) == (PREFILL, DECODE)
    assert (
        halves.prefill_discovery.port == halves.decode_discovery.port == graph.settings.pools[0].runtime.port
    )


def test_more_replicas_than_a_group_holds_are_refused_before_anything_is_created(tmp_path):
    with pytest.raises(
        (ProvisionError, FrontierError), match=r"disaggregation.prefill.replicas = 5 .*prefill holds 1 to 3"
    ):
        build(tmp_path, document(prefill_replicas=5))


def test_a_transfer_port_on_the_runtimes_port_is_refused(tmp_path):
    with pytest.raises((ProvisionError, FrontierError), match=r"runtime.kv_transfer.port = 8000"):
        build(tmp_path, document(kv_transfer={"port": 8000}))


def test_the_runtimes_command_line_takes_each_halfs_role_as_systemd_expands_it(graph):
    """The unit's command after the image, with node.env's value put in as systemd does, read by
    the runtime's own parser (``python -m frontier_runtime``)."""
    from frontier_runtime.__main__ import _parser

    (pool,) = graph.settings.pools
    unit = render_release_files(graph.settings, pool, DIGEST)["frontier-runtime.service"]
    (command,) = [line.strip() for line in unit.splitlines() if "python -m frontier_runtime" in line]
    argv = command.split()[3:]  # past "python -m frontier_runtime"
    for role in ("prefill", "decode"):
        args = _parser().parse_args([a.replace(f"${{{KV_ROLE_ENV}}}", role) for a in argv])
        assert (args.command, args.kv_role, str(args.config)) == (
            "serve",
            role,
            "/etc/frontier/release/runtime.yaml",
        )
