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
from infra.errors import ProvisionError

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
        "metering": {"uri": "s3://frontier-dev-metering-123456789012-us-west-2/metering"},
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


def test_the_gateway_reads_digests_and_what_it_boots_and_writes_metering_logs_and_metrics_only(gated) -> None:
    policy = json.loads(gated.one("aws:iam/rolePolicy:RolePolicy", "dev-gateway-policy").inputs["policy"])
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert set(by_sid) == {
        "ReadKeyDigests",
        "DecryptSecrets",
        "DiscoverRuntimes",
        "WriteMetering",
        "EncryptMetering",
        "ReadWhatItBoots",
        "ListWhatItBoots",
        "ShipItsLogs",
        "PutGatewayMetrics",
    }
    history = "frontier-dev-history-123456789012-us-west-2"
    assert by_sid["ReadWhatItBoots"]["Resource"] == f"arn:aws:s3:::{history}/history/dev/gateway/*"
    assert by_sid["ListWhatItBoots"]["Condition"] == {"StringLike": {"s3:prefix": "history/dev/gateway/*"}}
    assert by_sid["PutGatewayMetrics"]["Condition"] == {
        "StringEquals": {"cloudwatch:namespace": "Frontier/Runtime"}
    }
    assert all(
        arn.startswith("arn:aws:logs:us-west-2:123456789012:log-group:/frontier/dev/")
        for arn in by_sid["ShipItsLogs"]["Resource"]
    )
    assert by_sid["DiscoverRuntimes"]["Action"] == "ec2:DescribeInstances"
    assert any("secret:frontier/dev/tenants/acme-*" in arn for arn in by_sid["ReadKeyDigests"]["Resource"])
    assert (
        by_sid["WriteMetering"]["Resource"]
        == "arn:aws:s3:::frontier-dev-metering-123456789012-us-west-2/metering/*"
    )
    assert by_sid["EncryptMetering"]["Action"] == "kms:GenerateDataKey"
    assert by_sid["EncryptMetering"]["Condition"] == {
        "StringEquals": {"kms:ViaService": "s3.us-west-2.amazonaws.com"}
    }


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


def _user_data(graph) -> str:
    template = graph.one("aws:ec2/launchTemplate:LaunchTemplate", "dev-gateway-lt").inputs
    return base64.b64decode(template["userData"]).decode()


def _boot_files(graph) -> dict[str, str]:
    return {f["path"]: f["content"] for f in yaml.safe_load(_user_data(graph))["write_files"]}


def test_the_target_group_and_its_health_check_speak_https_to_the_gateways_port(gated) -> None:
    target_group = gated.one("aws:lb/targetGroup:TargetGroup").inputs
    assert (target_group["protocol"], target_group["port"]) == ("HTTPS", 8090)
    assert target_group["healthCheck"]["protocol"] == "HTTPS"
    assert target_group["healthCheck"]["path"] == gated.settings.health.readiness_path


def test_gateway_hosts_make_their_certificate_at_first_boot_and_serve_tls_with_it(gated) -> None:
    files = _boot_files(gated)
    unit = files["/etc/systemd/system/frontier-gateway.service"]
    assert (
        "--port 8090 --tls-cert /etc/frontier/gateway-tls/gateway.crt "
        "--tls-key /etc/frontier/gateway-tls/gateway.key" in unit
    )
    assert "openssl req -x509" in files["/usr/local/sbin/frontier-gateway-tls"]
    commands = files["/usr/local/sbin/frontier-gateway-boot"].splitlines()
    made = commands.index("/usr/local/sbin/frontier-gateway-tls /etc/frontier/gateway-tls frontier")
    assert made < commands.index("systemctl enable --now frontier-gateway.service")


def test_the_gateway_group_replaces_hosts_without_dropping_below_its_desired_healthy_count(gated) -> None:
    [group] = [g for g in gated.of_type(ASG) if g.name == "dev-gateway-asg"]
    refresh = group.inputs["instanceRefresh"]
    assert refresh["strategy"] == "Rolling"
    assert refresh["preferences"]["minHealthyPercentage"] == 100
    assert refresh["preferences"]["maxHealthyPercentage"] == 200  # replacements launch first
    # Healthy means healthy in the target group: a replacement counts once the ALB's check passes.
    assert group.inputs["healthCheckType"] == "ELB"
    # The group follows the template's newest version, so a new one is what the refresh rolls in.
    template = gated.one("aws:ec2/launchTemplate:LaunchTemplate", "dev-gateway-lt")
    assert template.inputs["updateDefaultVersion"] is True
    assert group.inputs["launchTemplate"]["id"] == template.id


def test_a_changed_gateway_config_is_new_user_data_and_the_same_config_the_same_bytes(gated) -> None:
    from frontier.render.boot import render_gateway_cloud_init

    settings = gated.settings
    rendered = render_gateway_cloud_init(settings, history_bucket="b", history_prefix="history/dev/")
    assert rendered == render_gateway_cloud_init(settings, history_bucket="b", history_prefix="history/dev/")
    changed = settings.model_copy(
        update={"gateway": settings.gateway.model_copy(update={"request_timeout_s": 100})}
    )
    assert rendered != render_gateway_cloud_init(changed, history_bucket="b", history_prefix="history/dev/")


def test_gateway_hosts_ship_the_gateways_log_and_host_metrics_under_the_gateway_node_group(gated) -> None:
    agent = json.loads(_boot_files(gated)["/etc/frontier/cloudwatch-agent.json"])
    shipped = {
        c["file_path"]: c["log_group_name"] for c in agent["logs"]["logs_collected"]["files"]["collect_list"]
    }
    assert shipped["/var/log/frontier-gateway.log"] == "/frontier/dev/gateway"
    assert (
        "StandardOutput=append:/var/log/frontier-gateway.log"
        in _boot_files(gated)["/etc/systemd/system/frontier-gateway.service"]
    )
    # Every log group the agent writes to is one the program creates (encrypted, with retention).
    groups = {g.inputs["name"] for g in gated.of_type("aws:cloudwatch/logGroup:LogGroup")}
    assert set(shipped.values()) <= groups
    collected = agent["metrics"]["metrics_collected"]
    assert {"cpu", "mem", "net"} <= set(collected)
    assert collected["cpu"]["append_dimensions"] == {"Stack": "dev", "NodeGroup": "gateway"}
    assert collected["procstat"][0]["pattern"] == "frontier_gateway"


def test_a_timer_publishes_the_gateways_metrics_with_each_pools_node_group(gated) -> None:
    files = _boot_files(gated)
    service = files["/etc/systemd/system/frontier-gateway-publish.service"]
    assert "-m frontier_hostside.bootstrap --env /etc/frontier/gateway.env publish-gateway" in service
    assert "OnUnitActiveSec=60" in files["/etc/systemd/system/frontier-gateway-publish.timer"]
    env = dict(line.split("=", 1) for line in files["/etc/frontier/gateway.env"].splitlines())
    settings = gated.settings
    assert env["FRONTIER_GATEWAY_POOLS"] == ",".join(
        f"{pool.name}={pool.group.name}" for pool in settings.pools
    )
    assert env["FRONTIER_HELD_METRIC"] == "HeldRequests"
    assert env["FRONTIER_GATEWAY_METRICS_URL"] == f"https://127.0.0.1:{settings.gateway.admin_port}/metrics"


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


def test_a_production_stack_behind_a_gateway_passes_the_targets_https_policy(gated) -> None:
    from test_policy import BY_NAME, resource_violations

    target_group = gated.one("aws:lb/targetGroup:TargetGroup")
    # dev counted as production: the rule applies, and the gateway's target group satisfies it.
    assert (
        resource_violations(
            BY_NAME["production-targets-https"], target_group, config={"productionStacks": ["dev"]}
        )
        == []
    )


def test_behind_a_gateway_the_deploy_role_may_neither_register_nor_deregister_a_target(gated) -> None:
    deploy = json.loads(gated.one("aws:iam/rolePolicy:RolePolicy", "dev-iam-deploy").inputs["policy"])
    actions = {
        action
        for statement in deploy["Statement"]
        for action in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
    }
    assert "DrainAndEnableTargets" not in {s["Sid"] for s in deploy["Statement"]}
    assert not {"elasticloadbalancing:RegisterTargets", "elasticloadbalancing:DeregisterTargets"} & actions


def test_the_mocks_gateway_images_carry_exactly_what_the_gateway_bake_installs() -> None:
    from frontier.config import host_image
    from frontier.render.boot import gateway_tools
    from tests.infra.cloud_mocks import GATEWAY_BAKED_TOOLS

    assert host_image.contents_value(gateway_tools()) == GATEWAY_BAKED_TOOLS


def test_a_stock_gateway_image_is_refused_before_anything_is_created_whatever_the_egress(gated) -> None:
    settings = gated.settings
    opened = settings.model_copy(
        update={"network": settings.network.model_copy(update={"egress": "internet"})}
    )
    for stack in (settings, opened):
        with pytest.raises(ProvisionError) as refused:
            run_program(stack, stock_images=(settings.gateway.ami_id,))
        [line] = [line.strip() for line in str(refused.value).splitlines() if "gateway.ami_id" in line]
        assert line == (
            f"gateway.ami_id = '{settings.gateway.ami_id}': a stock image (no frontier:host-tools tag) without "
            "gateway-venv, openssl, aws-cli-v2, amazon-cloudwatch-agent; gateway hosts install nothing at boot: "
            "bake one with `fab ami.bake -s dev --group gateway` and pin it here"
        )


def test_the_gateways_image_is_looked_up_among_the_accounts_and_canonicals_only(gated) -> None:
    lookups = [args for token, args in gated.invokes if token == "aws:ec2/getAmi:getAmi"]
    [gateway] = [args for args in lookups if args["filters"][0]["values"] == ["ami-0123456789abcdef0"]]
    assert gateway["owners"] == ["self", "099720109477"]


def test_an_image_baked_for_runtime_hosts_lacks_what_a_gateway_runs() -> None:
    from frontier.config import host_image
    from frontier.render.boot import gateway_tools
    from tests.infra.cloud_mocks import BAKED_TOOLS

    assert host_image.missing_from(BAKED_TOOLS, gateway_tools()) == ["gateway-venv", "openssl"]


def test_a_gateway_without_a_pinned_image_is_refused_naming_the_bake(gated) -> None:
    settings = gated.settings
    unpinned = settings.model_copy(update={"gateway": settings.gateway.model_copy(update={"ami_id": ""})})
    with pytest.raises(
        ProvisionError, match=r"gateway.ami_id is empty: .* `fab ami.bake -s dev --group gateway`"
    ):
        run_program(unpinned)
