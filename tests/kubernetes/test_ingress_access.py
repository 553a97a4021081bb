"""Who reaches the Ingress's load balancer on Kubernetes: the AWS Load Balancer Controller's scheme
and inbound-cidrs annotations, from the same ``edge`` settings as the EC2 balancer.

The controller reads ``alb.ingress.kubernetes.io/scheme`` (internet-facing or internal) and
``alb.ingress.kubernetes.io/inbound-cidrs`` (a comma-separated list of ranges its security group
admits); the Ingress with them stays valid under ``kubernetes-validate --strict``.
"""

from __future__ import annotations

import kubernetes_validate
import pytest

from frontier.errors import StackError
from frontier.targets import load_stack
from frontier.targets.kubernetes.manifests import ingress, service
from frontier.targets.kubernetes.network import (
    BACKEND_PROTOCOL_ANNOTATION,
    INBOUND_CIDRS_ANNOTATION,
    SCHEME_ANNOTATION,
    ingress_access_annotations,
    ingress_source_cidrs,
)
from frontier.targets.kubernetes.network_policies import network_policies

ALLOWED = ["203.0.113.0/24", "198.51.100.16/28"]


@pytest.fixture
def internal(k8s_stack):
    return load_stack("eks-prod", path=k8s_stack({"edge.scheme": "internal", "edge.allow_cidrs": ALLOWED}))


def test_an_internal_scheme_and_the_allowlist_become_the_controllers_annotations(internal):
    annotations = ingress_access_annotations(internal)
    assert annotations[SCHEME_ANNOTATION] == "internal"
    assert annotations[INBOUND_CIDRS_ANNOTATION] == "203.0.113.0/24,198.51.100.16/28"


def test_an_internal_balancer_without_an_allowlist_admits_the_vpc_alone(k8s_stack):
    settings = load_stack("eks-prod", path=k8s_stack({"edge.scheme": "internal"}))
    annotations = ingress_access_annotations(settings)
    assert annotations[INBOUND_CIDRS_ANNOTATION] == settings.network.vpc_cidr


def test_an_open_internet_facing_balancer_says_so(eks_prod):
    annotations = ingress_access_annotations(eks_prod)
    assert annotations[SCHEME_ANNOTATION] == "internet-facing"
    assert annotations[INBOUND_CIDRS_ANNOTATION] == "0.0.0.0/0"


def test_pods_are_reached_over_http_from_the_balancers_subnets_only(internal):
    assert ingress_access_annotations(internal)[BACKEND_PROTOCOL_ANNOTATION] == "HTTP"
    runtime_in = next(p for p in network_policies(internal) if p.name.endswith("-ingress"))
    [rule] = runtime_in.body["spec"]["ingress"]
    blocks = {peer["ipBlock"]["cidr"] for peer in rule["from"] if "ipBlock" in peer}
    assert set(ingress_source_cidrs(internal)) <= blocks
    assert rule["ports"] == [{"protocol": "TCP", "port": internal.runtime.port}]


def test_the_ingress_with_the_access_annotations_is_valid_strictly(internal):
    manifest = ingress(internal, service(internal, internal.only_pool)).to_dict()
    manifest["metadata"]["annotations"].update(ingress_access_annotations(internal))
    kubernetes_validate.validate(manifest, internal.kubernetes.cluster.version, strict=True)


def test_a_bad_client_range_is_refused_naming_the_field_and_value(k8s_stack):
    path = k8s_stack({"edge.allow_cidrs": ["203.0.113.0/24", "203.0.113.7/24"]})
    with pytest.raises(StackError, match=r"edge\.allow_cidrs\[1\] = '203\.0\.113\.7/24'.*host bits set"):
        load_stack("eks-prod", path=path)
