"""A stack of two models on EC2 boots each pool on its own node group: dev behind its gateway, serving
its model on its group and an 8B model on a group of its own (runtime port 8001), declared by the
whole program, under Pulumi's mocks and in a fresh interpreter as ``pulumi up``'s language host
runs it. Each group's launch template boots its pool (its history, its runtime's port, its
principal), the security groups open both runtime ports to the gateway and the monitoring side only,
each group has its own alarms, and the gateway finds each model on its group."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path

import pytest
import yaml
from infra_mocks import Graph, run_program
from test_language_host import launch
from test_pool_principals import SMALL, two_model_ec2_document

from frontier.access.gateway import gateway_config
from frontier.identity.pools import principal_suffix
from frontier.project import STACKS_DIR_ENV
from frontier.release.history import pool_history_prefix
from frontier.render.boot import gateway_release
from frontier.render.stack import render_stack
from frontier.targets import load_stack
from tests.gateway.stacks import write_stack

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
SMALL_PORT = 8001
DIGEST = "sha256:" + "1" * 64


def document() -> dict:
    """dev's two-model copy, the 8B pool's runtime on a port of its own."""
    doc = two_model_ec2_document()
    models = doc["config"]["frontier:models"]
    models[1]["runtime"] = {**copy.deepcopy(models[1]["runtime"]), "port": SMALL_PORT}
    return doc


@pytest.fixture(scope="module")
def stack_file(tmp_path_factory) -> Path:
    return write_stack(tmp_path_factory.mktemp("stacks"), document(), "dev")


@pytest.fixture(scope="module")
def graph(stack_file: Path) -> Graph:
    return run_program(load_stack("dev", path=stack_file))


def user_data(graph: Graph, group: str) -> str:
    template = graph.one(LAUNCH_TEMPLATE, f"{graph.stack}-{group}-lt")
    return base64.b64decode(template.inputs["userData"]).decode()


def test_the_program_builds_a_group_per_pool(graph):
    groups = {asg.name for asg in graph.of_type(ASG)}
    assert {f"dev-{pool.group.name}-asg" for pool in graph.settings.pools} <= groups
    assert len(graph.settings.pools) == 2


def test_each_groups_hosts_boot_their_own_pools_history_and_runtime(graph):
    for pool in graph.settings.pools:
        text = user_data(graph, pool.group.name)
        prefix = pool_history_prefix(graph.settings, pool.name, "history/dev/")
        assert f"FRONTIER_HISTORY_PREFIX={prefix}" in text
        assert f"models/{pool.name}/" in prefix
        assert f"FRONTIER_METRICS_URL=http://127.0.0.1:{pool.runtime.port}/" in text
        assert f"FRONTIER_NODE_GROUP={pool.group.name}" in text
    assert graph.settings.pool(SMALL).runtime.port == SMALL_PORT


def test_each_groups_hosts_run_as_their_pools_principal(graph):
    profiles = {p.name: p.outputs["arn"] for p in graph.of_type("aws:iam/instanceProfile:InstanceProfile")}
    for pool in graph.settings.pools:
        template = graph.one(LAUNCH_TEMPLATE, f"dev-{pool.group.name}-lt")
        expected = profiles[f"dev-iam-runtime{principal_suffix(graph.settings, pool)}"]
        assert template.inputs["iamInstanceProfile"]["arn"] == expected


def test_the_runtimes_take_each_pools_port_from_the_gateway_and_the_monitoring_side_only(graph):
    runtime = graph.one("aws:ec2/securityGroup:SecurityGroup", "dev-sg-runtime").id
    sources = {
        r.name: int(r.inputs["fromPort"])
        for r in graph.of_type(INGRESS)
        if r.inputs["securityGroupId"] == runtime
    }
    for port in (8000, SMALL_PORT):
        opened = sorted(name for name, p in sources.items() if p == port)
        assert len(opened) == 2, opened  # the gateway's and the monitoring side's
        assert any("from-gateway" in name for name in opened) and any("monitoring" in name for name in opened)


def test_each_serving_group_has_its_own_latency_queue_and_restart_alarms(graph):
    names = {a.inputs["name"] for a in graph.of_type(ALARM) if "name" in a.inputs}
    for pool in graph.settings.pools:
        for alarm in ("p99-latency", "queue-depth", "runtime-restarts"):
            assert f"frontier-dev-{alarm}-{pool.group.name}" in names


def test_the_gateway_finds_each_model_on_its_own_group_and_boots_that_config(graph):
    config = gateway_config(graph.settings, None)
    found = {m.name: (m.discovery.node_group, m.discovery.port) for m in config.models if m.discovery}
    assert found == {pool.name: (pool.group.name, pool.runtime.port) for pool in graph.settings.pools}
    gateway = base64.b64decode(graph.one(LAUNCH_TEMPLATE, "dev-gateway-lt").inputs["userData"]).decode()
    assert gateway_release(graph.settings) in gateway


def test_fab_render_writes_each_pools_release_files(graph):
    files = render_stack(graph.settings, DIGEST)
    for pool in graph.settings.pools:
        runtime = yaml.safe_load(files[f"release/{pool.name}/runtime.yaml"])
        assert (runtime["model"]["name"], runtime["port"]) == (pool.name, pool.runtime.port)
        assert f"cloud-init/{pool.group.name}.yaml" in files


def test_fab_render_run_as_fab_writes_each_pools_files_and_names_each_image(
    stack_file, capsys, monkeypatch, tmp_path
):
    from fab_program import fab

    monkeypatch.setenv(STACKS_DIR_ENV, str(stack_file.parent))
    code, out, err = fab(capsys, "render", "-s", "dev", "--out", str(tmp_path), "--digest", DIGEST)
    assert code == 0, err
    settings = load_stack("dev", path=stack_file)
    for pool in settings.pools:
        runtime = yaml.safe_load((tmp_path / "release" / pool.name / "runtime.yaml").read_text())
        assert runtime["port"] == pool.runtime.port
        assert f"@{DIGEST} (model {pool.name})" in out
        assert (tmp_path / "cloud-init" / f"{pool.group.name}.yaml").is_file()


@pytest.mark.slow
def test_pulumi_up_declares_both_pools_in_a_fresh_interpreter(stack_file, tmp_path):
    """The program as the CLI's language host runs it (tests/infra/language_host.py), reading the
    derived stack from a stacks folder of its own."""
    out = tmp_path / "dev.json"
    config = yaml.safe_load(stack_file.read_text())["config"]
    proc = launch("dev", config, out, stack_file.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    declared = json.loads(out.read_text())
    resources = {tuple(r) for r in declared["resources"]}
    settings = load_stack("dev", path=stack_file)
    for pool in settings.pools:
        assert (LAUNCH_TEMPLATE, f"dev-{pool.group.name}-lt") in resources
        assert (ASG, f"dev-{pool.group.name}-asg") in resources
    assert set(declared["outputs"]["runtime_role_arns"]) == {pool.name for pool in settings.pools}
    # Each pool's own API-keys secret, under its own name; no secret the pools share.
    named = {(typ, name): value for typ, name, value in declared["named"]}
    for pool in settings.pools:
        secret = (
            "aws:secretsmanager/secret:Secret",
            f"dev-secrets-api-keys{principal_suffix(settings, pool)}",
        )
        assert named[secret] == pool.runtime.api_keys_secret
    assert set(declared["outputs"]["api_keys_secret_arns"]) == {pool.name for pool in settings.pools}
    assert declared["outputs"]["api_keys_secret_arn"] == ""
