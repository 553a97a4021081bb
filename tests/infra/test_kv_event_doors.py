"""The runtimes' KV-event ports (``runtime.kv_events``: publish and replay) open to the gateway alone.

The EC2 program runs as ``pulumi up`` runs it: a fresh interpreter in the program's folder, the
language host's sequence (``language_host.py``), mocks standing in for the engine and AWS, which
cannot run here. The stack is dev with a gateway, its runtime's events on or off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from frontier_hostside import names
from test_language_host import declared as declared_as

from frontier import project

pytestmark = pytest.mark.slow

INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
STACK = "dev"


def dev_with_gateway(kv_events: dict[str, Any] | None) -> dict[str, Any]:
    document = yaml.safe_load((project.root() / "stacks" / f"Pulumi.{STACK}.yaml").read_text())
    config = document["config"]
    config["frontier:gateway"] = {
        "port": 8090,
        "metering": {"uri": "s3://frontier-dev-metering-123456789012-us-west-2/metering"},
        "ami_id": "ami-0123456789abcdef0",
        "request_timeout_s": 110,  # below dev's edge.idle_timeout_s (120 s): the ALB fronts the gateway
    }
    config["frontier:tenants"] = [
        {
            "name": "acme",
            "api_key_secret": "frontier/dev/tenants/acme",
            "models": [config["frontier:model"]["name"]],
            "requests_per_minute": 600,
            "tokens_per_minute": 100000,
            "max_concurrent_requests": 16,
            "priority": "interactive",
        }
    ]
    if kv_events is not None:
        config["frontier:runtime"]["kv_events"] = kv_events
    return document


def declared(document: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """What the language host declares for ``document`` as the stack file ``stacks/Pulumi.dev.yaml``."""
    return declared_as(STACK, document, tmp)


def rules_on_ports(run: dict[str, Any], kind: str, group: str, ports: set[int]) -> list[dict[str, Any]]:
    return [
        r
        for r in run["rules"]
        if r["type"] == kind and r["securityGroupId"] == run["groups"][group] and r.get("fromPort") in ports
    ]


@pytest.fixture(scope="module")
def events_on(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    on = {"enabled": True, "port": 6101, "replay_port": 6102}
    return declared(dev_with_gateway(on), tmp_path_factory.mktemp("on"))


@pytest.fixture(scope="module")
def events_off(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return declared(dev_with_gateway(None), tmp_path_factory.mktemp("off"))


def test_the_runtime_group_takes_the_event_and_replay_ports_from_the_gateways_group_only(events_on) -> None:
    doors = rules_on_ports(events_on, INGRESS, f"{STACK}-sg-runtime", {6101, 6102})
    assert sorted((r["fromPort"], r["toPort"]) for r in doors) == [(6101, 6101), (6102, 6102)]
    assert {r["referencedSecurityGroupId"] for r in doors} == {events_on["groups"][f"{STACK}-gateway-sg"]}
    assert all(r["ipProtocol"] == "tcp" and "cidrIpv4" not in r for r in doors)


def test_the_gateways_group_sends_to_the_runtime_group_on_those_ports_and_nobody_else_does(events_on) -> None:
    gateway, runtime = events_on["groups"][f"{STACK}-gateway-sg"], events_on["groups"][f"{STACK}-sg-runtime"]
    senders = [r for r in events_on["rules"] if r["type"] == EGRESS and r.get("fromPort") in {6101, 6102}]
    assert sorted((r["securityGroupId"], r["referencedSecurityGroupId"], r["fromPort"]) for r in senders) == [
        (gateway, runtime, 6101),
        (gateway, runtime, 6102),
    ]


def test_without_kv_events_no_rule_opens_the_event_ports(events_off) -> None:
    default_ports = {names.KV_EVENTS_PORT, names.KV_EVENTS_REPLAY_PORT}  # closed while the events are off
    assert not [r for r in events_off["rules"] if r.get("fromPort") in default_ports]
    assert not [name for _, name in events_off["resources"] if "kv-events" in name]
