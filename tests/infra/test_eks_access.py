"""Who reaches a created EKS cluster's API: the deploy role as a member of the stack's Role's group,
and the principals the stack names as admins (a CI pipeline's later `pulumi up`) — with EKS's API
authentication nobody else but the creator."""

from __future__ import annotations

import pytest
import yaml
from k8s_mocks import run_kubernetes

from frontier import project
from frontier.errors import StackError
from frontier.targets import load_stack

CI = "arn:aws:iam::123456789012:role/ci/github-actions-deploy"
ENTRY = "aws:eks/accessEntry:AccessEntry"
ASSOCIATION = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"


def with_admins(tmp_path, admins) -> object:
    document = yaml.safe_load((project.stacks_dir() / "Pulumi.eks-prod.yaml").read_text())
    document["config"]["frontier:kubernetes"]["cluster"]["admins"] = admins
    path = tmp_path / "Pulumi.eks-prod.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_stack("eks-prod", path=path)


def test_a_named_admin_gets_an_access_entry_and_cluster_admin_over_the_whole_cluster(tmp_path):
    graph = run_kubernetes(with_admins(tmp_path, [CI]))
    entries = {e.inputs["principalArn"]: e for e in graph.of_type(ENTRY)}
    assert CI in entries and "kubernetesGroups" not in entries[CI].inputs
    [association] = graph.of_type(ASSOCIATION)
    assert association.inputs["principalArn"] == CI
    assert (
        association.inputs["policyArn"]
        == "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
    )
    assert association.inputs["accessScope"] == {"type": "cluster"}
    # EKS refuses an association for a principal without an entry: the entry comes first.
    assert entries[CI].urn in association.dependencies


@pytest.mark.parametrize(
    "arn", ["arn:aws:iam::123456789012:group/ops", "github-actions", "arn:aws:iam::1234:role/ci"]
)
def test_an_admin_that_is_not_an_iam_role_or_user_arn_is_refused_at_load_naming_the_field(tmp_path, arn):
    with pytest.raises(StackError, match=r"kubernetes\.cluster\.admins"):
        with_admins(tmp_path, [arn])
