"""A Kubernetes stack whose pool publishes KV events routes that pool by them: the gateway's
ConfigMap (``gateway.yaml``) carries the pool's ``kv_routing``, its ports and block size read off the
pool's runtime section, its tokenizer off the pool's weights version; and the gateway's role may read
exactly those tokenizer objects, evaluated as AWS would by ``@cloud-copilot/iam-simulate``."""

from __future__ import annotations

import pytest
import yaml
from test_gateway_manifests import BIG, DIGEST

from frontier.identity.cloud import Cloud
from frontier.targets import load_stack
from frontier.targets.kubernetes import manifests as m
from infra.kubernetes_program import gateway_pod_policy
from tests.e2e.iam_simulation import Call, simulate

EVENTS, REPLAY = 6101, 6102
KEY = "arn:aws:kms:us-east-1:123456789012:key/k"
# A key policy that lets the account's IAM policies decide (AWS's default key policy).
KEY_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
            "Action": "kms:*",
            "Resource": "*",
        }
    ],
}


def _events_on(gateway_stack, block_size: int = 32, events: int = EVENTS, replay: int = REPLAY):
    path = gateway_stack(
        {
            "models[0].runtime.kv_events": {"enabled": True, "port": events, "replay_port": replay},
            "models[0].runtime.block_size": block_size,
        }
    )
    return load_stack("eks-gateway", path=path)


def _gateway_yaml(settings) -> dict:
    (config_map,) = [
        o
        for o in m.render_workload(settings, DIGEST).all()
        if o.kind == "ConfigMap" and o.name.startswith("frontier-gateway-config-")
    ]
    return yaml.safe_load(config_map.to_dict()["data"]["gateway.yaml"])


def _routing(settings) -> dict[str, dict | None]:
    return {pool["name"]: pool.get("kv_routing") for pool in _gateway_yaml(settings)["models"]}


def test_the_gateways_configmap_routes_the_pool_by_its_kv_events_on_its_ports(gateway_stack) -> None:
    settings = _events_on(gateway_stack)
    routing = _routing(settings)[BIG]
    pool = settings.pool(BIG)
    assert routing is not None
    assert (routing["events_port"], routing["replay_port"], routing["block_size"]) == (EVENTS, REPLAY, 32)
    assert routing["tokenizer_source"] == f"{pool.model.weights_uri}/{pool.model.version}"
    assert [name for name, r in _routing(settings).items() if r is not None] == [BIG]


def test_other_ports_make_another_configmap(gateway_stack, tmp_path) -> None:
    before = _routing(_events_on(gateway_stack))[BIG]
    after = _routing(_events_on(gateway_stack, block_size=16, events=7101, replay=7102))[BIG]
    assert before is not None and after is not None
    assert (after["events_port"], after["replay_port"], after["block_size"]) == (7101, 7102, 16)


def test_without_kv_events_no_pool_has_kv_routing(eks_gateway) -> None:
    assert all(r is None for r in _routing(eks_gateway).values())


@pytest.mark.slow
def test_the_gateways_role_reads_the_tokenizer_objects_and_no_weights_shard(gateway_stack) -> None:
    settings = _events_on(gateway_stack)
    cloud = Cloud("123456789012", "aws", settings.region, "amazonaws.com", (), "")
    document = gateway_pod_policy(settings, cloud, KEY)
    pool = settings.pool(BIG)
    version = f"arn:aws:s3:::{pool.model.weights_uri.removeprefix('s3://')}/{pool.model.version}"
    role = "arn:aws:iam::123456789012:role/frontier-gateway"
    via_s3 = (("kms:ViaService", f"s3.{settings.region}.amazonaws.com"),)
    calls = [
        Call(role, "s3:GetObject", f"{version}/tokenizer.json", (), "GetObject"),
        Call(role, "s3:GetObject", f"{version}/tokenizer_config.json", (), "GetObject"),
        Call(role, "kms:Decrypt", KEY, via_s3, "Decrypt"),
        Call(role, "s3:GetObject", f"{version}/model-00001-of-00002.safetensors", (), "GetObject"),
        Call(role, "s3:GetObject", f"{version}/config.json", (), "GetObject"),
        Call(role, "s3:ListBucket", version.split("/", 1)[0], (), "ListBucket"),
    ]
    found = simulate({"all": {role: [{"name": "gateway", "policy": document}]}}, calls, {KEY: KEY_POLICY})[
        "all"
    ]
    assert [d["decision"] for d in found] == ["Allowed"] * 3 + ["ImplicitlyDenied"] * 3
