"""Who may sign with a stack's release key, as AWS decides it: the key policy the program puts on the
key, and each principal's identity documents as the program renders them, evaluated together by
``@cloud-copilot/iam-simulate`` (``tools/iam-simulate``, through ``tests/e2e/iam_simulation.py``).

The deploy role signs; an account administrator whose own policy allows everything is refused
kms:Sign by the key policy's explicit Deny, yet still administers the key; a pool's runtime
principal (an EC2 host's role, which reads the public key and verifies, or a pod's) is refused
kms:Sign, even where its own document would grant it.
moto's KMS evaluates no key policy on kms:Sign (``moto/kms/policy_validator.py`` checks an
unconditional Deny of DescribeKey only), so the local stack's half of this is in
``tests/operate/test_release_key_grants.py``: the policy it holds, evaluated the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from infra_mocks import ACCOUNT_ID, Graph, graph_for
from k8s_mocks import run_kubernetes

from frontier.identity.key_policies import ONLY_SIGNER_SID
from frontier.identity.pools import principal_suffix
from frontier.targets import load_stack
from tests.e2e.iam_simulation import Call, simulate

KEY = "aws:kms/key:Key"
KEY_POLICY = "aws:kms/keyPolicy:KeyPolicy"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
# An administrator of the account, as `pulumi up` runs: AdministratorAccess's one statement.
ADMIN_ARN = f"arn:aws:iam::{ACCOUNT_ID}:role/Administrator"
ADMINISTRATOR_ACCESS = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
}
MESSAGE = (("kms:SigningAlgorithm", "ECDSA_SHA_256"), ("kms:MessageType", "RAW"))


@dataclass(frozen=True)
class Signers:
    """A program's release key, its policy, and the principals around it with their documents."""

    key_arn: str
    key_policy: dict[str, Any]
    deploy_arn: str
    host_arn: str
    documents: dict[str, list[dict[str, Any]]]

    def decide(self, *calls: tuple[str, str]) -> list[str]:
        """Each (principal ARN, action) on the key, decided with the key's policy."""
        asked = [
            Call(who, action, self.key_arn, MESSAGE if action == "kms:Sign" else (), action)
            for who, action in calls
        ]
        found = simulate({"all": self.documents}, asked, {self.key_arn: self.key_policy})["all"]
        return [d["decision"] for d in found]


def role(graph: Graph, name: str) -> tuple[str, dict[str, Any]]:
    arn = graph.one(ROLE, name).outputs["arn"]
    return arn, json.loads(graph.one(ROLE_POLICY, name).inputs["policy"])


def signers(graph: Graph, deploy: str, host: str) -> Signers:
    key = graph.one(KEY, f"{graph.stack}-release-key")
    [policy] = [p for p in graph.of_type(KEY_POLICY) if p.inputs["keyId"] == key.outputs["keyId"]]
    deploy_arn, deploy_document = role(graph, deploy)
    host_arn, host_document = role(graph, host)
    return Signers(
        key_arn=key.outputs["arn"],
        key_policy=json.loads(policy.inputs["policy"]),
        deploy_arn=deploy_arn,
        host_arn=host_arn,
        documents={
            deploy_arn: [{"name": "deploy", "policy": deploy_document}],
            host_arn: [{"name": "runtime", "policy": host_document}],
            ADMIN_ARN: [{"name": "AdministratorAccess", "policy": ADMINISTRATOR_ACCESS}],
        },
    )


def ec2() -> Signers:
    graph = graph_for("dev")
    suffix = principal_suffix(graph.settings, graph.settings.pools[0])
    return signers(graph, "dev-iam-deploy", f"dev-iam-runtime{suffix}")


def eks() -> Signers:
    graph = run_kubernetes(load_stack("eks-prod"))
    suffix = principal_suffix(graph.settings, graph.settings.pools[0])
    return signers(graph, "eks-prod-k8s-deploy", f"eks-prod-pods{suffix}-runtime")


@pytest.fixture(scope="module", params=[ec2, eks], ids=["ec2", "eks"])
def stack(request: pytest.FixtureRequest) -> Signers:
    return request.param()


def test_the_release_keys_policy_names_the_stacks_deploy_role_as_its_one_signer(stack):
    [deny] = [s for s in stack.key_policy["Statement"] if s["Sid"] == ONLY_SIGNER_SID]
    assert deny["Effect"] == "Deny" and deny["Action"] == "kms:Sign"
    assert deny["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": stack.deploy_arn}}


def test_the_deploy_role_signs_with_the_release_key(stack):
    assert stack.decide((stack.deploy_arn, "kms:Sign")) == ["Allowed"]


def test_an_account_administrator_cannot_sign_with_the_release_key(stack):
    assert stack.decide((ADMIN_ARN, "kms:Sign")) == ["ExplicitlyDenied"]


def test_an_account_administrator_still_administers_the_release_key(stack):
    actions = ("kms:DescribeKey", "kms:PutKeyPolicy", "kms:ScheduleKeyDeletion", "kms:TagResource")
    assert stack.decide(*((ADMIN_ARN, a) for a in actions)) == ["Allowed"] * len(actions)


def test_a_runtime_principal_cannot_sign_with_the_release_key(stack):
    assert stack.decide((stack.host_arn, "kms:Sign")) != ["Allowed"]


def test_an_ec2_host_reads_the_public_key_and_verifies_with_it():
    stack = ec2()
    decided = stack.decide((stack.host_arn, "kms:GetPublicKey"), (stack.host_arn, "kms:Verify"))
    assert decided == ["Allowed", "Allowed"]


def test_a_host_whose_own_document_granted_kms_sign_is_still_refused_by_the_key(stack):
    granted = {
        "Version": "2012-10-17",
        "Statement": [{"Sid": "Sign", "Effect": "Allow", "Action": "kms:Sign", "Resource": stack.key_arn}],
    }
    widened = Signers(
        **{
            **stack.__dict__,
            "documents": {**stack.documents, stack.host_arn: [{"name": "sign", "policy": granted}]},
        }
    )
    assert widened.decide((stack.host_arn, "kms:Sign")) == ["ExplicitlyDenied"]
