"""A stack with a gateway: its own CPU node group behind the ALB, and runtimes the ALB cannot reach.

Under Pulumi mocks (no Pulumi engine or AWS account here), like every test of the program.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml
from infra_mocks import run_program

from frontier import project
from frontier.targets import load_stack

INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
ASG = "aws:autoscaling/group:Group"


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory):
    document = yaml.safe_load((project.root() / "stacks" / "Pulumi.dev.yaml").read_text())
    config = document["config"]
    model = config["frontier:model"]["name"]
    config["frontier:gateway"] = {
        "port": 8090,
        "metering": {"uri": "s3://frontier-dev-metering-123456789012-us-east-1/metering"},
        "ami_id": "ami-0123456789abcdef0",
        "instance_type": "c7i.large",
        "request_timeout_s": 110,  # below dev's edge.idle_timeout_s (120 s): the ALB fronts the gateway
    }
    config["frontier:tenants"] = [
        {
            "name": "acme",
            "api_key_secret": "frontier/dev/tenants/acme",
            "models": [model],
            "requests_per_minute": 600,
            "tokens_per_minute": 100000,
            "max_concurrent_requests": 16,
            "priority": "interactive",
        }
    ]
    path = tmp_path_factory.mktemp("stacks") / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return run_program(load_stack("dev", path=Path(path)))


def _sg(graph, name):
    return graph.one("aws:ec2/securityGroup:SecurityGroup", name).id


def test_the_alb_targets_the_gateway_group_only(gated) -> None:
    target_group = gated.one("aws:lb/targetGroup:TargetGroup")
    assert target_group.inputs["port"] == 8090
    registered = [a for a in gated.of_type(ASG) if a.inputs.get("targetGroupArns")]
    assert [a.name for a in registered] == ["dev-gateway-asg"]
    gateway_asg = registered[0]
    assert gateway_asg.inputs["healthCheckType"] == "ELB"
    assert gateway_asg.inputs["minSize"] == 2


def test_runtimes_take_their_port_from_the_gateway_only(gated) -> None:
    runtime, alb, gateway = (
        _sg(gated, "dev-sg-runtime"),
        _sg(gated, "dev-sg-alb"),
        _sg(gated, "dev-gateway-sg"),
    )
    port = gated.settings.runtime.port
    sources = {
        r.inputs.get("referencedSecurityGroupId")
        for r in gated.of_type(INGRESS)
        if r.inputs["securityGroupId"] == runtime and r.inputs.get("fromPort") == port
    }
    assert gateway in sources and alb not in sources
    into_gateway = [r.inputs for r in gated.of_type(INGRESS) if r.inputs["securityGroupId"] == gateway]
    assert [(r["referencedSecurityGroupId"], r["fromPort"]) for r in into_gateway] == [(alb, 8090)]
    alb_out = {
        (r.inputs.get("referencedSecurityGroupId"), r.inputs["fromPort"])
        for r in gated.of_type(EGRESS)
        if r.inputs["securityGroupId"] == alb
    }
    assert alb_out == {(gateway, 8090)}


def test_the_gateway_reads_digests_and_writes_metering_only(gated) -> None:
    policy = json.loads(gated.one("aws:iam/rolePolicy:RolePolicy", "dev-gateway-policy").inputs["policy"])
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert set(by_sid) == {"ReadKeyDigests", "DecryptSecrets", "DiscoverRuntimes", "WriteMetering"}
    assert by_sid["DiscoverRuntimes"]["Action"] == "ec2:DescribeInstances"
    assert any("secret:frontier/dev/tenants/acme-*" in arn for arn in by_sid["ReadKeyDigests"]["Resource"])
    assert (
        by_sid["WriteMetering"]["Resource"]
        == "arn:aws:s3:::frontier-dev-metering-123456789012-us-east-1/metering/*"
    )


def test_gateway_hosts_are_private_with_imdsv2_and_boot_the_gateway(gated) -> None:
    template = gated.one("aws:ec2/launchTemplate:LaunchTemplate", "dev-gateway-lt").inputs
    assert template["instanceType"] == "c7i.large"
    assert template["metadataOptions"]["httpTokens"] == "required"
    assert template["networkInterfaces"][0]["associatePublicIpAddress"] == "false"
    user_data = base64.b64decode(template["userData"]).decode()
    assert (
        "python -m frontier_gateway serve --config /opt/frontier-gateway/gateway.yaml --port 8090"
        in user_data
    )
    assert "sk-" not in user_data


def test_a_stack_without_gateway_keeps_the_alb_on_the_runtimes(dev) -> None:
    assert not [r for r in dev.resources if r.name.startswith("dev-gateway")]
    registered = [a for a in dev.of_type(ASG) if a.inputs.get("targetGroupArns")]
    assert registered and all("gateway" not in a.name for a in registered)


def test_a_gateway_hosts_permissions_exist_before_its_group_waits_for_capacity(gated) -> None:
    # An instance profile gives a host its role at once, the role's policies only once attached: a
    # gateway that boots first cannot read its keys' digests and fails the ELB health check.
    [group] = [g for g in gated.of_type(ASG) if g.name == "dev-gateway-asg"]
    for typ, name in (
        ("aws:iam/rolePolicy:RolePolicy", "dev-gateway-policy"),
        ("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "dev-gateway-ssm"),
    ):
        assert gated.one(typ, name).urn in group.dependencies, f"{group.name} may launch before {name}"
