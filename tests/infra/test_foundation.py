"""The Foundation both programs stand on: one component, and no resource of an existing stack moved."""

from __future__ import annotations

import contextvars

import pytest
from infra_mocks import EngineUrnMonitor, Graph, _Recorder, _run
from k8s_mocks import EksMocks

from frontier.targets import load_stack
from infra.foundation import TYPE
from infra.program import build

FOUNDATION = f"{TYPE}$"
# The components the stack's root held before the Foundation did.
MOVED = {
    "frontier:secrets:Secrets",
    "frontier:network:Network",
    "frontier:storage:Storage",
    "frontier:registry:Registry",
}
# What the Foundation made after it took those over (no old URN to keep).
ADDED = {"frontier:release:ReleaseKey"}
# New since, and only on a stack with backup.region (eks-prod here; dev has none).
BACKUP = "frontier:backup:Backup"


def run_with_alias_urns(stack: str, mocks: type[_Recorder]) -> tuple[Graph, EngineUrnMonitor]:
    settings = load_stack(stack)
    recorder = mocks(settings.region)
    monitor = EngineUrnMonitor(recorder)
    return contextvars.Context().run(_run, settings, build, recorder, monitor), monitor


@pytest.fixture(scope="module", params=[("dev", _Recorder), ("eks-prod", EksMocks)], ids=["ec2", "eks"])
def aliased(request: pytest.FixtureRequest) -> tuple[Graph, EngineUrnMonitor]:
    return run_with_alias_urns(*request.param)


def test_the_foundation_holds_the_network_storage_registry_and_secrets_of_both_targets(aliased):
    graph, _ = aliased
    backup = {BACKUP} if graph.settings.backup.region else set()
    assert {r.type for r in graph.resources if r.parent_types == [TYPE]} == MOVED | ADDED | backup
    assert len(graph.of_type(TYPE)) == 1


def test_every_resource_in_the_foundation_answers_to_its_urn_from_the_stacks_root(aliased):
    """Pulumi replaces a resource whose URN it no longer finds in the stack's state; aliases to the
    URNs from before the Foundation keep the key, buckets, VPC and repository of existing stacks."""
    graph, monitor = aliased
    moved = [
        r for r in graph.resources if FOUNDATION in r.urn and not any(t in r.urn for t in ADDED | {BACKUP})
    ]
    assert moved
    for resource in moved:
        assert resource.urn.replace(FOUNDATION, "") in monitor.aliases[resource.urn], resource.urn
