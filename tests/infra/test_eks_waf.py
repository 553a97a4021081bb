"""An EKS stack with a rate limit puts a web ACL in front of the ALB its Ingress makes, as EC2's edge
does: the program makes the ACL, the Ingress names it, and the load balancer controller associates it."""

from __future__ import annotations

import pytest
from k8s_mocks import run_kubernetes

from frontier.targets import load_stack
from infra.addons import load_balancer_controller_policy
from infra.cloud import Cloud
from infra.workloads import WAF_ACL_ANNOTATION
from tests.infra.cloud_mocks import ACCOUNT_ID

WEB_ACL = "aws:wafv2/webAcl:WebAcl"
INGRESS = "kubernetes:networking.k8s.io/v1:Ingress"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"


@pytest.fixture(scope="module")
def eks():
    return run_kubernetes(load_stack("eks-prod"))


def test_the_web_acl_limits_each_client_ip_to_the_stacks_rate(eks):
    [acl] = eks.of_type(WEB_ACL)
    assert acl.inputs["scope"] == "REGIONAL"
    [rule] = acl.inputs["rules"]
    rate = rule["statement"]["rateBasedStatement"]
    assert (rate["limit"], rate["aggregateKeyType"], rule["action"]) == (
        eks.settings.edge.waf_rate_limit,
        "IP",
        {"block": {}},
    )


def test_the_ingress_names_the_web_acl_for_the_controller_to_associate(eks):
    [acl] = eks.of_type(WEB_ACL)
    [ingress] = eks.of_type(INGRESS)
    assert ingress.inputs["metadata"]["annotations"][WAF_ACL_ANNOTATION] == acl.outputs["arn"]


def test_the_controller_runs_with_wafv2_on(eks):
    controller = next(
        r for r in eks.of_type(HELM_RELEASE) if r.inputs["chart"] == "aws-load-balancer-controller"
    )
    assert controller.inputs["values"]["enableWafv2"] is True
    assert controller.inputs["values"]["enableWaf"] is False


def test_the_controller_may_associate_only_web_acls_with_load_balancers():
    cloud = Cloud(ACCOUNT_ID, "aws", "us-east-1", "amazonaws.com", ("us-east-1a",), "")
    policy = load_balancer_controller_policy(cloud, "c", "vpc-1", waf=True)
    [statement] = [s for s in policy["Statement"] if "wafv2:AssociateWebACL" in s["Action"]]
    assert statement["Resource"] == [
        f"arn:aws:wafv2:us-east-1:{ACCOUNT_ID}:regional/webacl/*/*",
        f"arn:aws:elasticloadbalancing:us-east-1:{ACCOUNT_ID}:loadbalancer/app/*/*",
    ]
    without = load_balancer_controller_policy(cloud, "c", "vpc-1")
    assert not [s for s in without["Statement"] if any(a.startswith("wafv2:") for a in s["Action"])]


def test_a_stack_without_a_rate_limit_makes_no_web_acl(tmp_path):
    settings = load_stack("eks-prod")
    settings = settings.model_copy(update={"edge": settings.edge.model_copy(update={"waf_rate_limit": 0})})
    graph = run_kubernetes(settings)
    assert not graph.of_type(WEB_ACL)
    [ingress] = graph.of_type(INGRESS)
    assert WAF_ACL_ANNOTATION not in ingress.inputs["metadata"]["annotations"]
