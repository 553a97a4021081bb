"""The runtimes' KV-event ports (``runtime.kv_events``: publish and replay) open to the gateway's pods
alone, on the kubernetes stack with a gateway and two pools (``stacks/Pulumi.eks-gateway.yaml``).

Validation as in ``test_manifests`` (kubernetes-validate, strict); no API server runs here.
"""

from __future__ import annotations

import pytest
from frontier_hostside import names
from test_gateway_manifests import APP, BIG, DECODE, DIGEST, PREFILL
from test_manifests import validate

from frontier.targets import load_stack
from frontier.targets.kubernetes import gateway as gw
from frontier.targets.kubernetes import manifests as m

EVENTS, REPLAY = 6101, 6102


@pytest.fixture
def events_on(gateway_stack):
    """eks-gateway with the 70B pool's runtimes publishing KV events on their own ports."""
    path = gateway_stack(
        {"models[0].runtime.kv_events": {"enabled": True, "port": EVENTS, "replay_port": REPLAY}}
    )
    return load_stack("eks-gateway", path=path)


def _policies(settings) -> dict[str, dict]:
    objects = m.render_workload(settings, DIGEST).all()
    for manifest in objects:
        validate(manifest.to_dict(), settings.kubernetes.cluster.version)
    return {o.name: o.to_dict() for o in objects if o.kind == "NetworkPolicy"}


def test_the_pools_runtimes_take_the_event_and_replay_ports_from_the_gateways_pods_only(events_on):
    policy = _policies(events_on)[f"{APP[BIG]}-kv-events"]["spec"]
    assert policy["podSelector"]["matchLabels"] == m.selector(events_on.for_pool(BIG))
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [
        {
            "from": [{"podSelector": {"matchLabels": gw.gateway_selector()}}],
            "ports": [{"protocol": "TCP", "port": EVENTS}, {"protocol": "TCP", "port": REPLAY}],
        }
    ]


def test_no_other_policy_admits_the_event_ports(events_on):
    for name, policy in _policies(events_on).items():
        if name == f"{APP[BIG]}-kv-events":
            continue
        for rule in policy["spec"].get("ingress", []):
            assert not {p.get("port") for p in rule.get("ports", [])} & {EVENTS, REPLAY}, name


def test_the_gateway_may_send_to_the_event_ports_of_that_pool_alone(events_on):
    egress = _policies(events_on)["frontier-gateway-egress"]["spec"]["egress"]
    to_pools = {
        rule["to"][0]["podSelector"]["matchLabels"][names.K8S_INSTANCE_LABEL]: [
            p["port"] for p in rule["ports"]
        ]
        for rule in egress
        if set(rule["to"][0]) == {"podSelector"}
    }
    runtime_port = events_on.for_pool(BIG).runtime.port
    assert to_pools[APP[BIG]] == [runtime_port, EVENTS, REPLAY]
    assert all(
        EVENTS not in ports and REPLAY not in ports for app, ports in to_pools.items() if app != APP[BIG]
    )
    assert {PREFILL, DECODE} <= set(to_pools)


def test_without_kv_events_no_policy_names_the_event_ports(eks_gateway):
    policies = _policies(eks_gateway)
    assert not [name for name in policies if name.endswith("-kv-events")]
    default_ports = {
        eks_gateway.pools[0].runtime.kv_events.port,
        eks_gateway.pools[0].runtime.kv_events.replay_port,
    }
    for policy in policies.values():
        for rule in [*policy["spec"].get("ingress", []), *policy["spec"].get("egress", [])]:
            assert not {p.get("port") for p in rule.get("ports", [])} & default_ports
