"""A fresh account: what AWS makes only with an account's first resource of a kind must exist before
the stack's own resources name it."""

from __future__ import annotations

import pytest
from infra_mocks import run_program
from k8s_mocks import run_kubernetes

from frontier.targets import load_stack

SERVICE_LINKED_ROLE = "aws:iam/serviceLinkedRole:ServiceLinkedRole"
KEY = "aws:kms/key:Key"
ROLE_ARN = (
    "arn:aws:iam::123456789012:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"
)


def run(stack: str, **mocks):
    settings = load_stack(stack)
    return run_kubernetes(settings, **mocks) if settings.kubernetes else run_program(settings, **mocks)


def stack_key(graph):
    return next(key for key in graph.of_type(KEY) if ROLE_ARN in key.inputs.get("policy", ""))


@pytest.mark.parametrize("stack", ["dev", "eks-prod"])
def test_a_fresh_account_gets_auto_scalings_service_linked_role_before_the_key_that_names_it(stack):
    # The key policy lets the role encrypt launched hosts' volumes; KMS refuses a policy naming a
    # principal that does not exist (MalformedPolicyDocument), and AWS makes the role only with the
    # account's first auto scaling group, which needs the key.
    graph = run(stack, fresh_account=True)
    [role] = graph.of_type(SERVICE_LINKED_ROLE)
    assert role.inputs["awsServiceName"] == "autoscaling.amazonaws.com"
    assert role.urn in stack_key(graph).dependencies


@pytest.mark.parametrize("stack", ["dev", "eks-prod"])
def test_the_service_linked_role_outlives_the_stack_that_made_it(stack):
    # It is the account's: other stacks' groups launch through it after this one is destroyed.
    [role] = run(stack, fresh_account=True).of_type(SERVICE_LINKED_ROLE)
    assert role.options is not None and role.options.retain_on_delete


@pytest.mark.parametrize("stack", ["dev", "eks-prod"])
def test_an_account_that_has_the_role_declares_none(stack):
    graph = run(stack)
    assert not graph.of_type(SERVICE_LINKED_ROLE)
    assert ROLE_ARN in stack_key(graph).inputs["policy"]
