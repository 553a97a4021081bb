"""The stack outputs, from both ends: what each target's program exports is what its backend reads.

The programs run under mocks through ``infra/__main__.py``, as ``pulumi up`` runs them; what they
export is saved as ``pulumi stack output --json`` saves it, and the toolkit's backend for the target
then answers every question it answers from the outputs.
"""

from __future__ import annotations

import json

import pytest
from infra_mocks import Graph, run_program
from k8s_mocks import run_kubernetes
from moto import mock_aws

from frontier.targets import backend_for, load_stack


@pytest.fixture(scope="module")
def eks() -> Graph:
    return run_kubernetes(load_stack("eks-prod"), entry_point=True)


@pytest.fixture
def save(tmp_path, monkeypatch):
    """Save a program's exports where ``fab`` reads them (``$FRONTIER_STACK_OUTPUTS``)."""

    def saved(graph: Graph) -> None:
        path = tmp_path / f"{graph.stack}.json"
        path.write_text(json.dumps(graph.outputs))
        monkeypatch.setenv("FRONTIER_STACK_OUTPUTS", str(path))

    return saved


def test_every_output_the_ec2_backend_reads_is_exported_by_the_ec2_program(dev, save):
    save(dev)
    backend = backend_for(dev.settings)
    with mock_aws():
        store, balancer = backend.history_store(), backend.balancer()
    alb = dev.one("aws:lb/loadBalancer:LoadBalancer").outputs["dnsName"]
    assert backend.endpoint() == f"https://{alb}"
    assert (store.bucket, store.prefix) == (dev.outputs["history_bucket"], f"history/{dev.stack}/")
    assert balancer.target_group_arn == dev.one("aws:lb/targetGroup:TargetGroup").outputs["arn"]


def test_every_output_the_kubernetes_backend_reads_is_exported_by_the_kubernetes_program(eks, save):
    save(eks)
    backend = backend_for(eks.settings)
    with mock_aws():
        store = backend.history_store()
    assert backend.endpoint() == f"https://{eks.settings.kubernetes.ingress.host}"
    assert (store.bucket, store.prefix) == (eks.outputs["history_bucket"], f"history/{eks.stack}/")


def test_the_ec2_endpoint_is_the_certificates_name_when_the_stack_gives_one(dev):
    # The load balancer's own DNS name is not on the certificate: tools calling it would fail TLS.
    named = dev.settings.model_copy(
        update={"edge": dev.settings.edge.model_copy(update={"domain": "api.dev.frontier.example"})}
    )
    assert run_program(named).outputs["endpoint"] == "https://api.dev.frontier.example"
