"""One declaration of production: ``frontier:production: true`` in the stack's file, read through
``frontier.config.checks.is_production`` by the EC2 program, the EKS program and the policy pack.
Each production stack gets every guard (protect on what outlives a release, ALB deletion protection,
90-day logs, the pack's production rules); a stack that is not production gets none of them."""

from __future__ import annotations

import pytest
from infra_mocks import Graph, Resource, graph_for
from k8s_mocks import run_kubernetes
from test_policy import BY_NAME, graph_violations, resource_violations, unexplained, with_protect

from frontier.config.checks import is_production
from frontier.config.load import available_stacks
from frontier.targets import load_stack
from infra.foundation import retention_days
from policy.rules import production
from policy.rules.production import ALB_ATTRIBUTES, STATEFUL, declared_production

PRODUCTION = ("prod", "prod-multinode", "moe-prod", "eks-prod", "eks-multinode")
EC2 = ("prod", "prod-multinode", "moe-prod", "dev")
EKS = ("eks-prod", "eks-multinode", "eks-gateway")
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
LB = "aws:lb/loadBalancer:LoadBalancer"
INGRESS = "kubernetes:networking.k8s.io/v1:Ingress"
_eks: dict[str, Graph] = {}


def graph_of(stack: str) -> Graph:
    if stack in EKS:
        if stack not in _eks:
            _eks[stack] = run_kubernetes(load_stack(stack))
        return _eks[stack]
    return graph_for(stack)


def protected(resource: Resource) -> bool:
    """``protect`` as the engine resolves it: the resource's own option, else its parent's."""
    options = resource.options
    protect = None if options is None else options.protect
    if protect is None and options is not None and options.parent is not None:
        protect = options.parent._protect
    return bool(protect)


def test_the_production_stacks_are_those_whose_file_says_so():
    declared = {stack for stack in available_stacks() if is_production(load_stack(stack))}
    assert declared == set(PRODUCTION)
    # The pack reads the same answer from the same files.
    assert {stack for stack in available_stacks() if declared_production(stack)} == set(PRODUCTION)
    assert not declared_production("no-such-stack")


def test_production_follows_the_setting_not_the_name():
    staging = load_stack("staging")
    assert not is_production(staging)
    assert is_production(staging.model_copy(update={"production": True}))


@pytest.mark.parametrize("stack", EC2 + EKS)
def test_stateful_resources_are_protected_exactly_on_production(stack):
    graph = graph_of(stack)
    stateful = [r for r in graph.resources if r.type in STATEFUL]
    assert stateful
    assert {r.name: protected(r) for r in stateful} == {r.name: stack in PRODUCTION for r in stateful}


@pytest.mark.parametrize("stack", EC2 + EKS)
def test_logs_are_kept_longer_exactly_on_production(stack):
    groups = graph_of(stack).of_type(LOG_GROUP)
    assert groups
    expected = retention_days(stack in PRODUCTION)
    assert {g.name: g.inputs["retentionInDays"] for g in groups} == {g.name: expected for g in groups}


@pytest.mark.parametrize("stack", EC2)
def test_the_alb_has_deletion_protection_exactly_on_production(stack):
    assert graph_of(stack).one(LB).inputs["enableDeletionProtection"] is (stack in PRODUCTION)


@pytest.mark.parametrize("stack", EKS)
def test_the_controllers_alb_has_deletion_protection_exactly_on_production(stack):
    [ingress] = graph_of(stack).of_type(INGRESS)
    attributes = dict(
        a.split("=", 1) for a in ingress.inputs["metadata"]["annotations"][ALB_ATTRIBUTES].split(",")
    )
    assert (attributes.get("deletion_protection.enabled") == "true") is (stack in PRODUCTION)


@pytest.mark.parametrize("stack", EC2 + EKS)
def test_the_packs_production_rules_apply_exactly_to_production(stack):
    # Each of the pack's production rules asks production_stacks whether a stack is production:
    # without config, the stack's own file answers.
    assert production.production_stacks(None)(stack) is (stack in PRODUCTION)
    assert production.production_stacks({"productionStacks": ["dev"]})(stack) is (stack == "dev")
    assert all(p.config_schema is not None for p in production.POLICIES)


@pytest.mark.parametrize("stack", EC2 + EKS)
def test_an_unprotected_bucket_is_refused_exactly_on_production(stack):
    bucket = graph_of(stack).of_type("aws:s3/bucket:Bucket")[0]
    violations = resource_violations(BY_NAME["production-stateful-protected"], with_protect(bucket, False))
    assert bool(violations) is (stack in PRODUCTION)


@pytest.mark.parametrize("stack", EC2 + EKS)
@pytest.mark.parametrize("rule", sorted(p.name for p in production.POLICIES))
def test_each_stack_passes_the_packs_production_rules(stack, rule):
    assert unexplained(rule, graph_violations(BY_NAME[rule], graph_of(stack))) == []
