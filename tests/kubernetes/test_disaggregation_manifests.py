"""A disaggregated pool on Kubernetes (eks-gateway's 8B pool: prefill on ``l40s-prefill``, decode on
``l40s``): two Deployments with their roles, the transfer port open between the pair only, a scaler
and a disruption budget per half, the gateway's two hops; and what such a stack refuses.

Validation as in ``test_manifests`` (kubernetes-validate, strict; CRD objects against the pinned
schemas); no API server runs here.
"""

from __future__ import annotations

import pytest
from frontier_gateway.config import parse_config
from frontier_hostside import names
from frontier_hostside.names import RUNNING_METRIC, WAITING_METRIC
from test_gateway_manifests import _refused
from test_manifests import validate

from frontier.render.host import render_runtime_config
from frontier.targets.kubernetes import disaggregation as pd
from frontier.targets.kubernetes import gateway as gw
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes.objects import KV_ROLE_LABEL

DIGEST = "sha256:" + "ab" * 32
SMALL = "llama-3.1-8b-instruct"
PREFILL, DECODE = "frontier-llama-3-1-8b-instruct-prefill", "frontier-llama-3-1-8b-instruct-decode"
KV_PORT = 5600


@pytest.fixture(scope="module")
def workload(eks_gateway) -> m.Workload:
    return m.render_workload(eks_gateway, DIGEST)


def _by(workload: m.Workload, kind: str) -> dict[str, dict]:
    return {o.name: o.to_dict() for o in workload.all() if o.kind == kind}


def _container(workload: m.Workload, name: str) -> dict:
    return _by(workload, "Deployment")[name]["spec"]["template"]["spec"]["containers"][0]


def test_every_object_of_both_halves_and_their_canaries_validates_strictly(eks_gateway, workload):
    version = eks_gateway.kubernetes.cluster.version
    names_ = {o.name for o in workload.all()}
    assert {PREFILL, DECODE, f"{PREFILL}-kv-transfer", f"{DECODE}-kv-transfer"} <= names_
    for manifest in workload.all():
        validate(manifest.to_dict(), version)
    pool = eks_gateway.pool(SMALL)
    for half in pd.role_pools(pool):
        config = render_runtime_config(eks_gateway, pd.released_runtime(pool))
        canary = m.deployment(eks_gateway, half, DIGEST, config, track="canary", replicas=1)
        validate(canary.to_dict(), version)


def test_the_pool_runs_as_two_deployments_each_on_its_halfs_node_pool_with_its_role(eks_gateway, workload):
    node_pools = {p.node_group: p.labels for p in eks_gateway.kubernetes.node_pools}
    deployments = _by(workload, "Deployment")
    assert SMALL not in {name.removeprefix("frontier-") for name in deployments}
    for name, role, group in ((PREFILL, "prefill", "l40s-prefill"), (DECODE, "decode", "l40s")):
        template = deployments[name]["spec"]["template"]
        assert template["spec"]["nodeSelector"] == node_pools[group]
        assert template["metadata"]["labels"][KV_ROLE_LABEL] == role
        command = template["spec"]["containers"][0]["command"]
        assert command[command.index("--kv-role") + 1] == role


def test_both_halves_mount_one_runtime_config_the_pools_release_renders(eks_gateway, workload):
    (prefill, decode) = (p.config_map.to_dict()["data"]["runtime.yaml"] for p in workload.pools[1:])
    view = eks_gateway.for_pool(SMALL)
    assert prefill == decode == render_runtime_config(view, view.only_pool)
    assert "role: both" in prefill  # each pod's command says its half


def test_a_prefill_listens_for_pulls_at_its_pod_address_and_a_decode_does_not_listen(workload):
    prefill, decode = _container(workload, PREFILL), _container(workload, DECODE)
    assert {"name": "kv-transfer", "containerPort": KV_PORT, "protocol": "TCP"} in prefill["ports"]
    assert prefill["command"][-4:] == ["--kv-role", "prefill", "--kv-host", "$(POD_IP)"]
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert pod_ip in prefill["env"]
    assert [p["name"] for p in decode["ports"]] == ["http"]
    assert "--kv-host" not in decode["command"] and pod_ip not in decode["env"]


def test_only_decode_pods_reach_the_prefill_pods_transfer_port(workload):
    policies = _by(workload, "NetworkPolicy")
    prefill_pods = {
        "matchLabels": {names.K8S_APP_LABEL: names.CONTAINER_NAME, names.K8S_INSTANCE_LABEL: PREFILL}
    }
    decode_pods = {
        "matchLabels": {names.K8S_APP_LABEL: names.CONTAINER_NAME, names.K8S_INSTANCE_LABEL: DECODE}
    }
    port = [{"protocol": "TCP", "port": KV_PORT}]
    pulls_in = policies[f"{PREFILL}-kv-transfer"]["spec"]
    assert pulls_in == {
        "podSelector": prefill_pods,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": decode_pods}], "ports": port}],
    }
    pulls_out = policies[f"{DECODE}-kv-transfer"]["spec"]
    assert pulls_out == {
        "podSelector": decode_pods,
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"podSelector": prefill_pods}], "ports": port}],
    }
    # No other policy names the transfer port: the default deny holds it shut to anything else.
    others = [name for name, p in policies.items() if f"'port': {KV_PORT}" in str(p)]
    assert sorted(others) == sorted([f"{PREFILL}-kv-transfer", f"{DECODE}-kv-transfer"])


def test_the_gateway_reaches_both_halves_on_the_serving_port_only(eks_gateway, workload):
    policies = _by(workload, "NetworkPolicy")
    gateway_pods = {"podSelector": {"matchLabels": gw.gateway_selector()}}
    for half in (PREFILL, DECODE):
        (serving,) = policies[f"{half}-ingress"]["spec"]["ingress"]
        assert gateway_pods in serving["from"] and serving["ports"] == [{"protocol": "TCP", "port": 8000}]
    egress = policies[f"{gw.GATEWAY_NAME}-egress"]["spec"]["egress"]
    to_halves = [
        r
        for r in egress
        if r["to"][0].get("podSelector", {}).get("matchLabels", {}).get(names.K8S_INSTANCE_LABEL)
        in (PREFILL, DECODE)
    ]
    assert [r["ports"] for r in to_halves] == [[{"protocol": "TCP", "port": 8000}]] * 2


def test_the_prefill_scales_on_prompts_waiting_and_the_decode_on_streams_running(eks_gateway, workload):
    scalers = _by(workload, "ScaledObject")
    prefill, decode = scalers[PREFILL]["spec"], scalers[DECODE]["spec"]
    assert prefill["scaleTargetRef"]["name"] == PREFILL and decode["scaleTargetRef"]["name"] == DECODE
    load = {"queue-depth", "running"}
    assert [t["name"] for t in prefill["triggers"] if t["name"] in load] == ["queue-depth"]
    assert [t["name"] for t in decode["triggers"] if t["name"] in load] == ["running"]
    (waiting,) = [t for t in prefill["triggers"] if t["name"] == "queue-depth"]
    assert waiting["metadata"]["query"].startswith(f"sum({WAITING_METRIC}{{")
    assert f'service="{PREFILL}"' in waiting["metadata"]["query"]
    (running,) = [t for t in decode["triggers"] if t["name"] == "running"]
    assert running["metadata"]["query"].startswith(f"sum({RUNNING_METRIC}{{")
    assert f'service="{DECODE}"' in running["metadata"]["query"]
    pool = eks_gateway.pool(SMALL)
    assert (
        running["metadata"]["threshold"]
        == f"{pool.runtime.max_concurrency * pool.group.scale_in_utilisation:g}"
    )


def test_the_prefill_half_scales_out_on_its_ttft_p90_and_the_decode_half_does_not(workload):
    scalers = _by(workload, "ScaledObject")
    (latency,) = [t for t in scalers[PREFILL]["spec"]["triggers"] if t["name"] == "ttft-p90"]
    assert f'service="{PREFILL}"' in latency["metadata"]["query"]
    assert "ttft-p90" not in [t["name"] for t in scalers[DECODE]["spec"]["triggers"]]


def test_each_half_keeps_its_replicas_while_it_serves_and_goes_to_zero_when_idle(eks_gateway, workload):
    halves = eks_gateway.pool(SMALL).disaggregation
    scalers = _by(workload, "ScaledObject")
    for name, role in ((PREFILL, halves.prefill), (DECODE, halves.decode)):
        spec = scalers[name]["spec"]
        assert (spec["idleReplicaCount"], spec["minReplicaCount"]) == (0, role.replicas)
        assert "held-by-gateway" in [t["name"] for t in spec["triggers"]]


def test_each_half_has_its_own_disruption_budget(eks_gateway, workload):
    budgets = _by(workload, "PodDisruptionBudget")
    for name in (PREFILL, DECODE):
        spec = budgets[name]["spec"]
        assert spec["maxUnavailable"] == eks_gateway.rollout.batch_size
        assert spec["selector"]["matchLabels"][names.K8S_INSTANCE_LABEL] == name


def test_the_gateway_sends_prefill_then_decode_and_falls_back_to_the_decode_service(eks_gateway, workload):
    config = parse_config(workload.gateway.config_map.to_dict()["data"][gw.GATEWAY_CONFIG_FILE])
    (pool,) = [p for p in config.models if p.name == SMALL]
    namespace = eks_gateway.kubernetes.namespace
    url = f"http://{{}}.{namespace}.svc.cluster.local:8000"
    assert pool.disaggregation is not None
    assert pool.disaggregation.prefill == (url.format(PREFILL),)
    assert pool.disaggregation.decode == (url.format(DECODE),)
    assert pool.replicas == (url.format(DECODE),)


def test_the_halves_share_the_pools_identity(workload):
    accounts = [o.name for o in workload.all() if o.kind == "ServiceAccount"]
    assert len(accounts) == len(set(accounts))
    runtime_accounts = {
        d["spec"]["template"]["spec"]["serviceAccountName"]
        for n, d in _by(workload, "Deployment").items()
        if n in (PREFILL, DECODE)
    }
    assert runtime_accounts == {"frontier-runtime-llama-3-1-8b-instruct"}


# --- what a disaggregated kubernetes stack refuses -------------------------------------------------------


def test_a_prefill_group_without_a_node_pool_is_refused(gateway_stack, eks_gateway):
    pools = [p.model_dump() for p in eks_gateway.kubernetes.node_pools if p.node_group != "l40s-prefill"]
    line = _refused(
        gateway_stack({"kubernetes.node_pools": pools}), "models[1].disaggregation.prefill.node_group"
    )
    assert "= 'l40s-prefill'" in line and "no kubernetes.node_pools entry" in line


def test_a_disaggregated_pool_without_a_gateway_is_refused(gateway_stack):
    line = _refused(gateway_stack({"gateway": None, "tenants": []}), "models[1].disaggregation")
    assert "frontier:gateway" in line


def test_a_pool_named_like_a_disaggregated_pools_half_is_refused(gateway_stack):
    # models[0] renders frontier-llama-3-1-8b-instruct-decode, the 8B pool's decode half's name.
    line = _refused(
        gateway_stack({"models[0].model.name": "llama-3.1-8b-instruct-decode"}), "models[1].model.name"
    )
    assert "'frontier-llama-3-1-8b-instruct-decode'" in line and "models[0]" in line


@pytest.mark.parametrize("replicas", [1, 9])
def test_a_half_whose_floor_is_outside_the_autoscalers_range_is_refused(gateway_stack, replicas):
    path = gateway_stack({"models[1].disaggregation.decode.replicas": replicas})
    line = _refused(path, "models[1].disaggregation.decode.replicas")
    assert f"= {replicas}" in line and "rollout.batch_size (1" in line and "max_replicas (8)" in line
