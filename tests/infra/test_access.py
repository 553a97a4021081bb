"""Who reaches whom (security groups) and who may do what (IAM)."""

from __future__ import annotations

import json

import pytest
from infra_mocks import ACCOUNT_ID

from infra.edge import TARGET_TLS_PORT

INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"


def sg(graph, key):
    return graph.one("aws:ec2/securityGroup:SecurityGroup", f"{graph.stack}-sg-{key}").id


def rules(graph, kind, group_id):
    return [r.inputs for r in graph.of_type(kind) if r.inputs["securityGroupId"] == group_id]


def source(rule):
    return rule.get("cidrIpv4") or rule.get("cidrIpv6") or rule.get("referencedSecurityGroupId")


def reachable(graph, group_id):
    """(source, protocol, port) for every ingress rule of a security group."""
    return {(source(r), r["ipProtocol"], r.get("fromPort")) for r in rules(graph, INGRESS, group_id)}


def policy(graph, name):
    return json.loads(
        graph.one("aws:iam/rolePolicy:RolePolicy", f"{graph.stack}-iam-{name}").inputs["policy"]
    )


def granted(document):
    return {sid["Sid"]: sid for sid in document["Statement"]}


# --- security groups ------------------------------------------------------------------------------


def test_the_alb_takes_https_and_the_redirect_port_from_anywhere(graph):
    assert reachable(graph, sg(graph, "alb")) == {("0.0.0.0/0", "tcp", 443), ("0.0.0.0/0", "tcp", 80)}


def test_the_alb_talks_only_to_the_tls_port_of_the_hosts(graph):
    [out] = rules(graph, EGRESS, sg(graph, "alb"))
    port = TARGET_TLS_PORT
    assert (out["referencedSecurityGroupId"], out["fromPort"], out["toPort"]) == (
        sg(graph, "runtime"),
        port,
        port,
    )


def test_the_alb_reaches_the_tls_port_and_the_monitoring_side_the_runtime_port(graph):
    port = graph.settings.runtime.port
    sources = {s for s, _, p in reachable(graph, sg(graph, "runtime")) if p == port}
    assert sources == {sg(graph, "monitoring")}
    tls = {s for s, _, p in reachable(graph, sg(graph, "runtime")) if p == TARGET_TLS_PORT}
    assert tls == {sg(graph, "alb")}
    assert graph.outputs["monitoring_security_group_id"] == sg(graph, "monitoring")
    # The monitoring group takes nothing in; it only scrapes the runtime port.
    assert not rules(graph, INGRESS, sg(graph, "monitoring"))
    [out] = rules(graph, EGRESS, sg(graph, "monitoring"))
    assert (out["referencedSecurityGroupId"], out["fromPort"]) == (sg(graph, "runtime"), port)


@pytest.mark.parametrize("stack", ["staging", "prod"])
def test_with_a_bastion_hosts_take_ssh_only_from_its_group(stack, request):
    graph = request.getfixturevalue(stack)
    assert reachable(graph, sg(graph, "runtime")) == {
        (sg(graph, "alb"), "tcp", TARGET_TLS_PORT),
        (sg(graph, "monitoring"), "tcp", graph.settings.runtime.port),
        (sg(graph, "bastion"), "tcp", 22),
    }
    assert not rules(graph, INGRESS, sg(graph, "bastion"))  # the operator's bastion brings its own allow-list


def test_without_a_bastion_hosts_take_no_ssh_at_all(dev):
    assert dev.outputs["host_access"] == "ssm"
    port = dev.settings.runtime.port
    assert reachable(dev, sg(dev, "runtime")) == {
        (sg(dev, "alb"), "tcp", TARGET_TLS_PORT),
        (sg(dev, "monitoring"), "tcp", port),
    }
    assert not [s for s in dev.of_type("aws:ec2/securityGroup:SecurityGroup") if s.name.endswith("-bastion")]


def test_nothing_but_the_alb_accepts_traffic_from_the_internet(graph):
    public = [
        r
        for r in graph.of_type(INGRESS)
        if r.inputs.get("cidrIpv4") == "0.0.0.0/0" or r.inputs.get("cidrIpv6")
    ]
    assert {r.inputs["securityGroupId"] for r in public} == {sg(graph, "alb")}


def test_hosts_reach_out_only_over_https_to_the_vpc_and_s3(graph):
    egress = {
        (r.get("cidrIpv4") or "prefix list", r["ipProtocol"], r.get("fromPort"))
        for r in rules(graph, EGRESS, sg(graph, "runtime"))
    }
    # network.egress: endpoints (every cloud stack): the interface endpoints and S3's gateway endpoint.
    assert egress == {(graph.settings.network.vpc_cidr, "tcp", 443), ("prefix list", "tcp", 443)}


# --- the runtime role -----------------------------------------------------------------------------


def test_the_runtime_role_is_assumable_only_by_ec2(graph):
    trust = json.loads(
        graph.one("aws:iam/role:Role", f"{graph.stack}-iam-runtime").inputs["assumeRolePolicy"]
    )
    assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "ec2.amazonaws.com"}]


def test_the_runtime_reads_only_its_models_prefix(graph):
    bucket, prefix = graph.outputs["weights_bucket"], graph.outputs["weights_prefix"]
    statements = granted(policy(graph, "runtime"))
    assert statements["ReadItsModelWeights"]["Action"] == ["s3:GetObject", "s3:GetObjectVersion"]
    assert statements["ReadItsModelWeights"]["Resource"] == f"arn:aws:s3:::{bucket}/{prefix}/*"
    # It reads the keys its manifest names and never lists them (tests/e2e/test_task_actors.py: no
    # recorded call of a runtime lists), so it may not list the weights bucket at all.
    assert not [
        s for s in statements.values() if "s3:ListBucket" in s["Action"] and bucket in str(s["Resource"])
    ]


def test_the_runtime_reads_only_its_secret_and_decrypts_only_through_s3_and_secrets_manager(graph):
    statements = granted(policy(graph, "runtime"))
    assert statements["ReadItsApiKeys"]["Resource"] == graph.outputs["api_keys_secret_arn"]
    decrypt = statements["DecryptWeightsAndSecret"]
    assert (decrypt["Action"], decrypt["Resource"]) == ("kms:Decrypt", graph.outputs["kms_key_arn"])
    region = graph.settings.region
    assert decrypt["Condition"]["StringEquals"]["kms:ViaService"] == [
        f"s3.{region}.amazonaws.com",
        f"secretsmanager.{region}.amazonaws.com",
    ]


def test_the_runtime_writes_only_its_own_logs_and_metrics_namespace(graph):
    statements = granted(policy(graph, "runtime"))
    logs = statements["WriteItsLogs"]["Resource"]
    assert all(f":log-group:/frontier/{graph.stack}/*" in arn for arn in logs)
    metrics = statements["PutRuntimeMetrics"]
    assert metrics["Condition"] == {"StringEquals": {"cloudwatch:namespace": "Frontier/Runtime"}}


def test_the_runtime_role_grants_nothing_else(graph):
    actions = {
        a
        for s in policy(graph, "runtime")["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    services = {a.split(":")[0] for a in actions}
    expected = {"s3", "secretsmanager", "kms", "ecr", "logs", "cloudwatch", "autoscaling"}
    if graph.outputs["host_access"] == "ssm":
        expected |= {"ssm", "ssmmessages", "ec2messages"}
    assert services == expected
    assert not any("*" in a for a in actions)
    unscoped = {
        a
        for s in policy(graph, "runtime")["Statement"]
        if s["Resource"] == "*"
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert {a.split(":")[0] for a in unscoped} <= {
        "ecr",
        "cloudwatch",
        "ssm",
        "ssmmessages",
        "ec2messages",
        "autoscaling",
    }
    assert "ecr:GetAuthorizationToken" in unscoped and "ecr:BatchGetImage" not in unscoped
    # The one unscoped autoscaling action only reads which group and lifecycle state a host is in.
    assert {a for a in unscoped if a.startswith("autoscaling:")} == {
        "autoscaling:DescribeAutoScalingInstances"
    }


def test_a_booting_host_reads_the_history_and_writes_only_its_boot_record(graph):
    statements = granted(policy(graph, "runtime"))
    history = f"arn:aws:s3:::{graph.outputs['history_bucket']}/history/{graph.stack}"
    assert statements["ReadTheCurrentRelease"]["Action"] == "s3:GetObject"
    assert sorted(statements["ReadTheCurrentRelease"]["Resource"]) == [
        f"{history}/{sub}/*" for sub in ("artifacts", "host", "records", "releases")
    ]
    assert statements["RecordItsBoot"] == {
        "Sid": "RecordItsBoot",
        "Effect": "Allow",
        "Action": "s3:PutObject",
        "Resource": f"{history}/boots/*",
    }
    # Nothing lets a host write what the stack serves (records/) or a release; beside its boot record
    # it writes only the prepared weights and compiled kernels of its weights versions (tests below).
    writes = [s for s in statements.values() if "s3:PutObject" in s["Action"]]
    assert [s["Sid"] for s in writes] == ["KeepItsPreparedWeights", "KeepItsCompiledKernels", "RecordItsBoot"]


def test_the_runtime_keeps_the_kernels_it_compiled_under_its_versions_kernels_prefix(graph):
    bucket, prefix = graph.outputs["weights_bucket"], graph.outputs["weights_prefix"]
    keep = granted(policy(graph, "runtime"))["KeepItsCompiledKernels"]
    assert keep["Action"] == "s3:PutObject"
    assert keep["Resource"] == f"arn:aws:s3:::{bucket}/{prefix}/*/kernels/*"


def test_the_runtime_writes_in_the_weights_bucket_only_the_prepared_weights_of_a_version(graph):
    bucket, prefix = graph.outputs["weights_bucket"], graph.outputs["weights_prefix"]
    statements = granted(policy(graph, "runtime"))
    keep = statements["KeepItsPreparedWeights"]
    assert keep["Action"] == ["s3:PutObject", "s3:AbortMultipartUpload"]
    assert keep["Resource"] == f"arn:aws:s3:::{bucket}/{prefix}/*/prepared/*"
    encrypt = statements["EncryptWhatItWrites"]
    assert (encrypt["Action"], encrypt["Resource"]) == ("kms:GenerateDataKey", graph.outputs["kms_key_arn"])
    assert encrypt["Condition"]["StringEquals"]["kms:ViaService"] == f"s3.{graph.settings.region}.amazonaws.com"


def test_hosts_complete_lifecycle_actions_only_on_groups_tagged_with_their_stack(graph):
    lifecycle = json.loads(
        graph.one("aws:iam/rolePolicy:RolePolicy", f"{graph.stack}-iam-lifecycle").inputs["policy"]
    )
    [statement] = lifecycle["Statement"]
    assert statement["Action"] == [
        "autoscaling:CompleteLifecycleAction",
        "autoscaling:RecordLifecycleActionHeartbeat",
    ]
    # Auto scaling groups by tag: the grant exists before the groups whose ARNs it would name.
    assert (
        statement["Resource"]
        == f"arn:aws:autoscaling:{graph.settings.region}:{ACCOUNT_ID}:autoScalingGroup:*"
    )
    assert statement["Condition"] == {"StringEquals": {"aws:ResourceTag/frontier:stack": graph.stack}}
    groups = graph.of_type("aws:autoscaling/group:Group")
    assert len(groups) >= len(graph.settings.node_groups)
    for group in groups:
        assert {"key": "frontier:stack", "value": graph.stack, "propagateAtLaunch": True} in group.inputs[
            "tags"
        ]
    role = graph.one("aws:iam/role:Role", f"{graph.stack}-iam-runtime")
    assert (
        graph.one("aws:iam/rolePolicy:RolePolicy", f"{graph.stack}-iam-lifecycle").inputs["role"]
        == (role.outputs["name"])
    )


# --- the deploy role ------------------------------------------------------------------------------


def test_the_deploy_role_is_separate_and_assumed_by_the_accounts_principals(graph):
    role = graph.one("aws:iam/role:Role", f"{graph.stack}-iam-deploy")
    trust = json.loads(role.inputs["assumeRolePolicy"])
    assert [s["Principal"] for s in trust["Statement"]] == [{"AWS": "arn:aws:iam::123456789012:root"}]
    assert graph.outputs["deploy_role_arn"] == role.outputs["arn"] != graph.outputs["runtime_role_arn"]


def test_the_deploy_role_drains_only_its_own_target_group(graph):
    drain = granted(policy(graph, "deploy"))["DrainAndEnableTargets"]
    assert drain["Resource"] == graph.outputs["target_group_arn"]
    assert set(drain["Action"]) == {
        "elasticloadbalancing:RegisterTargets",
        "elasticloadbalancing:DeregisterTargets",
    }


def test_the_deploy_role_reads_and_writes_history_only_under_the_stacks_prefix(graph):
    history = granted(policy(graph, "deploy"))["ReadWriteDeployHistoryAndLocks"]
    assert history["Resource"] == f"arn:aws:s3:::{graph.outputs['history_bucket']}/history/{graph.stack}/*"


def test_the_deploy_role_surges_only_its_stacks_node_groups(graph):
    surge = granted(policy(graph, "deploy"))["SurgeItsNodeGroups"]
    assert surge["Condition"] == {"StringEquals": {"aws:ResourceTag/frontier:stack": graph.stack}}
    # Scale, protect the hosts a deploy touches, pause AZRebalance, retire a host after a surge.
    assert set(surge["Action"]) == {
        "autoscaling:SetDesiredCapacity",
        "autoscaling:SetInstanceProtection",
        "autoscaling:SuspendProcesses",
        "autoscaling:ResumeProcesses",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
    }


def test_the_deploy_role_refreshes_only_its_stacks_gateway_group(graph):
    refresh = granted(policy(graph, "deploy"))["RefreshItsGatewayHosts"]
    assert refresh["Action"] == "autoscaling:StartInstanceRefresh"
    assert refresh["Condition"] == {"StringEquals": {"aws:ResourceTag/frontier:stack": graph.stack}}
    assert (
        "autoscaling:DescribeInstanceRefreshes" in granted(policy(graph, "deploy"))["SeeTheCluster"]["Action"]
    )


def test_the_deploy_role_reads_usage_only_where_the_gateway_meters_to_s3(graph):
    gateway = graph.settings.gateway
    usage = {"ReadItsUsage", "ListItsUsage"}
    meters_to_s3 = gateway is not None and gateway.metering.uri.startswith("s3://")
    assert usage & set(granted(policy(graph, "deploy"))) == (usage if meters_to_s3 else set())


def test_fab_usage_reads_the_gateways_metering_records_only_under_their_prefix(tmp_path):
    """The metering location reaches the deploy role's document from the stack's gateway section."""
    from infra_mocks import run_program

    from frontier.targets import load_stack
    from tests.gateway.stacks import dev_gateway_document, write_stack

    bucket = f"frontier-dev-metering-{ACCOUNT_ID}-us-west-2"
    document = dev_gateway_document(metering={"uri": f"s3://{bucket}/metering"}, instance_type="c7i.large")
    path = write_stack(tmp_path, document, "dev")
    graph = run_program(load_stack("dev", path=path))
    statements = granted(policy(graph, "deploy"))
    assert statements["ReadItsUsage"]["Action"] == "s3:GetObject"
    assert statements["ReadItsUsage"]["Resource"] == f"arn:aws:s3:::{bucket}/metering/*"
    assert statements["ListItsUsage"]["Resource"] == f"arn:aws:s3:::{bucket}"
    assert statements["ListItsUsage"]["Condition"] == {
        "StringLike": {"s3:prefix": ["metering", "metering/*"]}
    }
