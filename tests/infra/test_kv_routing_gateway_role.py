"""An EC2 stack whose pool publishes KV events: the ``gateway.yaml`` its gateway hosts boot from
(``fab gateway.publish``) routes the pool by them, the program runs as ``pulumi up`` runs it
(``language_host.py``) with the gateway's role policy declared, and that policy, as the program
renders it under Pulumi's mocks, may read that pool's tokenizer files and not one other object of
its weights, evaluated as AWS would by ``@cloud-copilot/iam-simulate``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from infra_mocks import run_program
from test_kv_event_doors import STACK, declared, dev_with_gateway

from frontier.access.gateway import render_gateway_config
from frontier.targets import load_stack
from tests.e2e.iam_simulation import Call, simulate

pytestmark = pytest.mark.slow

EVENTS = {"enabled": True, "port": 6101, "replay_port": 6102}
ROLE = "arn:aws:iam::123456789012:role/dev-gateway"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return dev_with_gateway(EVENTS)


@pytest.fixture(scope="module")
def run(document: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return declared(document, tmp_path_factory.mktemp("kv-routing"))


def _settings(document: dict[str, Any], folder: Path):
    path = folder / f"Pulumi.{STACK}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_stack(STACK, path=path)


def test_the_gateway_yaml_its_hosts_boot_from_routes_the_pool_by_its_kv_events(document, tmp_path) -> None:
    settings = _settings(document, tmp_path)
    (pool,) = yaml.safe_load(render_gateway_config(settings, None))["models"]
    assert pool["discovery"]["node_group"] == settings.only_pool.group.name
    routing = pool["kv_routing"]
    assert (routing["events_port"], routing["replay_port"]) == (6101, 6102)
    assert routing["block_size"] == settings.only_pool.runtime.block_size
    model = settings.only_pool.model
    assert routing["tokenizer_source"] == f"{model.weights_uri}/{model.version}"


def test_pulumi_up_declares_the_gateways_role_policy_in_a_fresh_interpreter(run) -> None:
    assert ["aws:iam/rolePolicy:RolePolicy", f"{STACK}-gateway-policy"] in run["resources"]


def test_the_gateway_role_reads_the_tokenizer_files_and_no_other_weights_object(document, tmp_path) -> None:
    graph = run_program(_settings(document, tmp_path))
    granted = json.loads(
        graph.one("aws:iam/rolePolicy:RolePolicy", f"{STACK}-gateway-policy").inputs["policy"]
    )
    model = document["config"]["frontier:model"]
    version = f"arn:aws:s3:::{model['weights_uri'].removeprefix('s3://')}/{model['version']}"
    other = f"arn:aws:s3:::{model['weights_uri'].removeprefix('s3://')}/not-{model['version']}"
    calls = [
        Call(ROLE, "s3:GetObject", f"{version}/tokenizer.json", (), "GetObject"),
        Call(ROLE, "s3:GetObject", f"{version}/tokenizer_config.json", (), "GetObject"),
        Call(ROLE, "s3:GetObject", f"{version}/model-00001-of-00002.safetensors", (), "GetObject"),
        Call(ROLE, "s3:GetObject", f"{version}/manifest.json", (), "GetObject"),
        Call(ROLE, "s3:GetObject", f"{other}/tokenizer.json", (), "GetObject"),
    ]
    found = simulate({"all": {ROLE: [{"name": "gateway", "policy": granted}]}}, calls)["all"]
    assert [d["decision"] for d in found] == ["Allowed", "Allowed"] + ["ImplicitlyDenied"] * 3
