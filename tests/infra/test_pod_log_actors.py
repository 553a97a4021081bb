"""The pods' log shipper as AWS would judge it and as ``pulumi up`` builds it.

Its role's document, as the EKS program makes it under mocks, is evaluated by
``@cloud-copilot/iam-simulate`` (``tools/iam-simulate``, through :mod:`tests.e2e.iam_simulation`); the
program is also run in a fresh interpreter as the CLI's language host runs it
(``tests/infra/language_host.py``), and its log groups and the role's policy are read from there.
"""

from __future__ import annotations

import json

import pytest
from k8s_mocks import run_kubernetes

from frontier.identity.documents import log_group_name
from frontier.targets import load_stack
from frontier.targets.kubernetes.logging import shipped_groups
from infra.foundation import retention_days
from tests.e2e.iam_simulation import Call, simulate

ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
ACCOUNT_REGION = "us-east-1:123456789012"


def group_arn(name: str) -> str:
    return f"arn:aws:logs:{ACCOUNT_REGION}:log-group:{name}"


def stream_arn(name: str, pod: str) -> str:
    return f"{group_arn(name)}:log-stream:{pod}"


@pytest.fixture(scope="module")
def shipper() -> tuple[str, dict]:
    graph = run_kubernetes(load_stack("eks-gateway"))
    role = graph.one(ROLE, "eks-gateway-logs-shipper").outputs["arn"]
    return role, json.loads(graph.one(ROLE_POLICY, "eks-gateway-logs-shipper").inputs["policy"])


def decisions(shipper: tuple[str, dict], calls: list[tuple[str, str]]) -> list[str]:
    role, document = shipper
    found = simulate(
        {"all": {role: [{"name": "shipper", "policy": document}]}},
        [Call(role, action, resource, (), action.split(":")[1]) for action, resource in calls],
    )["all"]
    return [d["decision"] for d in found]


def test_the_shipper_writes_a_stream_per_pod_into_the_runtime_and_gateway_groups(shipper):
    runtime, gateway = log_group_name("eks-gateway", "runtime"), log_group_name("eks-gateway", "gateway")
    calls = [
        ("logs:CreateLogStream", stream_arn(runtime, "frontier-llama-7d9f8c-abcde")),
        ("logs:PutLogEvents", stream_arn(runtime, "frontier-llama-7d9f8c-abcde")),
        ("logs:DescribeLogStreams", group_arn(runtime)),
        ("logs:CreateLogStream", stream_arn(gateway, "frontier-gateway-5c6d-xyz12")),
        ("logs:PutLogEvents", stream_arn(gateway, "frontier-gateway-5c6d-xyz12")),
        ("logs:DescribeLogStreams", group_arn(gateway)),
    ]
    assert decisions(shipper, calls) == ["Allowed"] * len(calls)


def test_the_shipper_may_write_no_other_group_nor_change_its_own(shipper):
    runtime = log_group_name("eks-gateway", "runtime")
    calls = [
        ("logs:PutLogEvents", stream_arn(log_group_name("eks-gateway", "cloud-init"), "i-1")),
        ("logs:PutLogEvents", stream_arn(log_group_name("prod", "runtime"), "p")),
        ("logs:PutLogEvents", stream_arn("/aws/eks/eks-gateway/cluster", "p")),
        ("logs:CreateLogGroup", group_arn(runtime)),
        ("logs:PutRetentionPolicy", group_arn(runtime)),
        ("logs:DeleteLogGroup", group_arn(runtime)),
        ("logs:DeleteLogStream", stream_arn(runtime, "p")),
        ("logs:GetLogEvents", stream_arn(runtime, "p")),
    ]
    assert decisions(shipper, calls) == ["ImplicitlyDenied"] * len(calls)


@pytest.mark.slow
def test_pulumi_up_as_the_language_host_runs_it_makes_the_groups_with_retention_and_the_shippers_policy(
    tmp_path,
):
    from test_language_host import run_as_language_host

    run = run_as_language_host("eks-prod", tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    whole = json.loads((tmp_path / "eks-prod.json").read_text())["whole"]
    settings = load_stack("eks-prod")
    groups = {r["name"]: r for r in whole if r["type"] == LOG_GROUP}
    for name in shipped_groups(settings):
        assert int(groups[name]["retentionInDays"]) == retention_days(production=True)
        assert groups[name]["kmsKeyId"]  # the stack's key (its ARN, as the mocks give it)
    [policy] = [r for r in whole if r["type"] == ROLE_POLICY and r["resource"] == "eks-prod-logs-shipper"]
    document = json.loads(policy["policy"])
    resources = {arn.split(":log-group:")[1].split(":")[0] for arn in document["Statement"][0]["Resource"]}
    assert resources == set(shipped_groups(settings))
