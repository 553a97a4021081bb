"""The deploy role's Role holds exactly what ``fab`` does in the namespace: every request the
rollouts make is allowed by a rule (fake_apiserver authorizes as RBAC does, and every deploy and
rollback test of this folder runs under it), and every rule is used by some rollout here.

Real and mocked as in ``test_canary_gates`` (whose fixtures these tests use): the ``kubernetes``
client over TCP, the deploy path, history on moto; the API server and its controllers are
``fake_apiserver``.
"""

# The fixtures come from test_canary_gates: a test's parameters name them.
# ruff: noqa: F811

from __future__ import annotations

import pytest
from test_backend import VirtualClock
from test_canary_gates import (  # noqa: F401 (fixtures)
    GOOD_A,
    GOOD_B,
    WRONG,
    answers,
    cluster,
    endpoints_at_forward,
    multinode,
    settings,
    store,
)

from frontier.rollout.deploy import deploy, rollback
from frontier.rollout.rolling import RolloutFailed
from frontier.targets import load_stack
from frontier.targets.kubernetes.backend import KubernetesBackend
from frontier.targets.kubernetes.deploy_access import DEPLOY_GROUP, deploy_role, deploy_rules


def used(fake) -> set[tuple[str, str, str]]:
    assert all(allowed for *_, allowed in fake.authorized), [a for a in fake.authorized if not a[-1]]
    return {(verb, group, resource) for verb, group, resource, _ in fake.authorized}


def halved_batch(settings):
    runtime = settings.only_pool.runtime
    batch = runtime.batch.model_copy(update={"max_batch_size": runtime.batch.max_batch_size // 2})
    return settings.with_pool(
        settings.only_pool.model_copy(update={"runtime": runtime.model_copy(update={"batch": batch})})
    )


def granted(rules) -> set[tuple[str, str, str]]:
    return {(verb, rule.api_group, rule.resource) for rule in rules for verb in rule.verbs}


def test_a_deployment_pools_rollouts_use_every_verb_the_role_grants_and_no_other(cluster, settings, store):
    # One release kept: each rollout prunes the ConfigMap of the one before.
    settings = settings.model_copy(
        update={"rollout": settings.rollout.model_copy(update={"keep_releases": 1})}
    )
    backend = KubernetesBackend(settings, settings.only_pool, clock=VirtualClock())
    deploy(backend, GOOD_A)  # the provisioned image's first release: nothing to record from
    deploy(backend, GOOD_B)  # a canary verified over port-forward and gated on the pods' metrics
    with pytest.raises(RolloutFailed):
        deploy(backend, WRONG)  # a canary that fails its verification, removed
    rollback(backend)
    # A changed runtime setting is a new ConfigMap; the one before it is pruned.
    halved = halved_batch(settings)
    deploy(KubernetesBackend(halved, halved.only_pool, clock=VirtualClock()), GOOD_B)
    # The portforward upgrade is a GET; API servers from 1.31 also ask create of it.
    assert used(cluster) | {("create", "", "pods/portforward")} == granted(deploy_rules(settings))


def test_a_leader_worker_set_pools_rollouts_use_every_verb_the_role_grants_and_no_other(multinode):
    backend, fake = multinode
    deploy(backend, GOOD_B)
    with pytest.raises(RolloutFailed):
        deploy(backend, WRONG)  # both templates put back
    rules = deploy_rules(backend.settings)
    assert ("patch", "leaderworkerset.x-k8s.io", "leaderworkersets") in used(fake)
    assert used(fake) <= granted(rules)
    assert {r for r in granted(rules) if r[1] == "leaderworkerset.x-k8s.io"} <= used(fake)


def test_a_stack_with_no_leader_worker_set_grants_none():
    assert not [r for r in deploy_rules(load_stack("eks-prod")) if r.api_group == "leaderworkerset.x-k8s.io"]


def test_the_deploy_role_reads_no_secret_and_changes_no_service_or_policy():
    for stack in ("eks-prod", "eks-multinode", "eks-gateway"):
        resources = {r.resource for r in deploy_rules(load_stack(stack))}
        assert not resources & {
            "secrets",
            "services",
            "networkpolicies",
            "roles",
            "rolebindings",
            "serviceaccounts",
        }


def test_the_role_is_bound_to_the_group_the_access_entry_names_in_the_stacks_namespace_only():
    settings = load_stack("eks-multinode")
    role, binding = deploy_role(settings)
    assert role.kind == "Role" and role.namespace == binding.namespace == settings.kubernetes.namespace
    assert binding.body["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role.name,
    }
    assert binding.body["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": DEPLOY_GROUP}
    ]
