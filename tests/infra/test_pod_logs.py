"""The pods' logs on a Kubernetes stack, as the Pulumi program provisions them: EC2's log groups (names,
retention, key), the shipper's role and its association, and what Pulumi applies of the shipper.

Mocked: the Pulumi engine and the AWS and Kubernetes providers (``pulumi.runtime.set_mocks``): nothing is
created. Whether lines arrive in CloudWatch only a real cluster shows.
"""

from __future__ import annotations

import json

import pytest
from infra_mocks import Graph, run_program
from k8s_mocks import run_kubernetes

from frontier.targets import load_stack
from frontier.targets.kubernetes.logging import LOGGING_NAMESPACE, SHIPPER_SERVICE_ACCOUNT, shipped_groups
from infra.foundation import retention_days
from tests.gateway.stacks import dev_gateway_document, write_stack

LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
KEY = "aws:kms/key:Key"
ASSOCIATION = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
K8S_SERVICE_ACCOUNT = "kubernetes:core/v1:ServiceAccount"
K8S_DAEMON_SET = "kubernetes:apps/v1:DaemonSet"


@pytest.fixture(scope="module")
def eks_gateway() -> Graph:
    return run_kubernetes(load_stack("eks-gateway"))


@pytest.fixture(scope="module")
def eks_prod() -> Graph:
    return run_kubernetes(load_stack("eks-prod"))


def log_groups(graph: Graph) -> dict[str, dict]:
    return {r.inputs["name"]: r.inputs for r in graph.of_type(LOG_GROUP)}


def generic(name: str, stack: str) -> str:
    return name.replace(f"/{stack}/", "/<stack>/")


def test_the_eks_program_makes_the_groups_its_pods_ship_to(eks_gateway):
    made = log_groups(eks_gateway)
    assert set(shipped_groups(eks_gateway.settings)) <= set(made)
    assert shipped_groups(eks_gateway.settings) == [
        "/frontier/eks-gateway/runtime",
        "/frontier/eks-gateway/gateway",
    ]


def test_the_pod_log_groups_carry_the_ec2_names_for_the_runtime_and_the_gateway(tmp_path, eks_gateway):
    """Both programs, side by side: the EKS stack's shipped groups are the EC2 stack's groups of the
    same purposes, the stack's name apart."""
    ec2 = run_program(load_stack("dev", path=write_stack(tmp_path, dev_gateway_document(), "dev")))
    ec2_names = {generic(name, ec2.stack) for name in log_groups(ec2)}
    eks_names = {generic(name, eks_gateway.stack) for name in shipped_groups(eks_gateway.settings)}
    assert eks_names == {"/frontier/<stack>/runtime", "/frontier/<stack>/gateway"}
    assert eks_names <= ec2_names
    # EC2's are encrypted with its stack's key, as the EKS program's are (below).
    ec2_key = ec2.one(KEY, f"{ec2.stack}-secrets-key").outputs["arn"]
    assert log_groups(ec2)[f"/frontier/{ec2.stack}/runtime"]["kmsKeyId"] == ec2_key


def test_the_pod_log_groups_keep_a_production_stacks_retention_encrypted_with_its_key(eks_prod):
    key_arn = eks_prod.one(KEY, "eks-prod-secrets-key").outputs["arn"]
    for group in shipped_groups(eks_prod.settings):
        inputs = log_groups(eks_prod)[group]
        assert int(inputs["retentionInDays"]) == retention_days(production=True) == 90
        assert inputs["kmsKeyId"] == key_arn


def test_the_shippers_role_may_write_streams_in_exactly_the_shipped_groups(eks_gateway):
    document = json.loads(eks_gateway.one(ROLE_POLICY, "eks-gateway-logs-shipper").inputs["policy"])
    [statement] = document["Statement"]
    assert sorted(statement["Action"]) == [
        "logs:CreateLogStream",
        "logs:DescribeLogStreams",
        "logs:PutLogEvents",
    ]
    groups = {r.split(":log-group:")[1].split(":")[0] for r in statement["Resource"]}
    assert groups == set(shipped_groups(eks_gateway.settings))


def test_the_shippers_service_account_is_associated_with_its_role(eks_gateway):
    association = eks_gateway.one(ASSOCIATION, "eks-gateway-logs-shipper").inputs
    role = eks_gateway.one(ROLE, "eks-gateway-logs-shipper").outputs["arn"]
    assert (association["namespace"], association["serviceAccount"]) == (
        LOGGING_NAMESPACE,
        SHIPPER_SERVICE_ACCOUNT,
    )
    assert association["roleArn"] == role
    trust = json.loads(eks_gateway.one(ROLE, "eks-gateway-logs-shipper").inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}


def test_pulumi_applies_the_shippers_account_and_config_but_not_its_daemon_set(eks_gateway):
    """The policy pack refuses a node's paths and root for every workload: the DaemonSet is fab render's."""
    accounts = [r.inputs["metadata"]["name"] for r in eks_gateway.of_type(K8S_SERVICE_ACCOUNT)]
    assert SHIPPER_SERVICE_ACCOUNT in accounts
    assert not [r for r in eks_gateway.of_type(K8S_DAEMON_SET) if "fluent-bit" in r.name]
