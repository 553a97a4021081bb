"""The policy pack: every rule passes on the program's resources and fires on a violating one.

Resources reach the rules as the Pulumi engine hands them over: resource rules get one resource's
inputs, stack rules every resource's outputs, both under their wire names and wrapped in
pulumi-policy's unknown-checking proxy. The violating resources are the program's own with one
property changed, so each rule is shown to see exactly that property.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import runpy
from pathlib import Path
from typing import Any

import pulumi
import pulumi_policy
import pytest
import yaml
from infra_mocks import Graph, Resource
from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import unknown_checking_proxy

from infra.edge import TARGET_TLS_PORT
from policy.rules import POLICIES, quota_store
from policy.rules.kubernetes import (
    K8S_LEADER_WORKER_SET,
    K8S_WORKLOADS,
    check_k8s_pdb_and_network_policy,
    pod_specs,
)
from policy.rules.production import ALB_ATTRIBUTES

POLICY_DIR = Path(__file__).resolve().parents[2] / "policy"
BY_NAME = {p.name: p for p in POLICIES}
ADVISORY = {
    "ecr-scan-on-push",
    "lb-deletion-protection",
    "log-groups-encrypted-with-retention",
    "asg-discovery-tags",
    "runtime-web-egress-to-anywhere",
    "lb-redirect-port-public",
}
# The stack's own resources that break a rule today, and why each is let through: every such rule is
# advisory (test_known_breaks_are_advisory), and the programs' tests accept violations of these alone.
KNOWN_BREAKS = {
    # The ALB's port 80 only redirects to HTTPS (alb-http-redirects-to-https).
    "lb-redirect-port-public": ("dev-sg-alb-80", "staging-sg-alb-80", "prod-sg-alb-80"),
}


def unexplained(name: str, violations: list[str]) -> list[str]:
    """The violations not of a resource KNOWN_BREAKS lets through for this rule."""
    known = KNOWN_BREAKS.get(name, ())
    return [v for v in violations if v.split(": ", 1)[0] not in known]


def policy_options(resource: Resource) -> PolicyResourceOptions:
    """The options the engine hands a policy: ``protect`` as the SDK resolves it, from the resource's
    own options or else inherited from its parent (whose ``_protect`` is already resolved)."""
    options = resource.options
    protect = None if options is None else options.protect
    if protect is None and options is not None and options.parent is not None:
        protect = options.parent._protect
    return PolicyResourceOptions(bool(protect), [], None, [], None, [], None)


def with_protect(resource: Resource, protect: bool) -> Resource:
    return dataclasses.replace(resource, options=pulumi.ResourceOptions(protect=protect))


def resource_violations(policy: ResourceValidationPolicy, resource: Resource, config=None) -> list[str]:
    found: list[str] = []
    args = ResourceValidationArgs(
        resource.type,
        unknown_checking_proxy(copy.deepcopy(resource.inputs)),
        resource.urn,
        resource.name,
        policy_options(resource),
        None,
        config,
    )
    policy.validate(args, lambda message, urn=None: found.append(message))
    return found


def stack_violations(policy: StackValidationPolicy, resources: list[Resource]) -> list[str]:
    found: list[str] = []
    policy_resources = [
        PolicyResource(
            r.type, unknown_checking_proxy(copy.deepcopy(r.outputs)), r.urn, r.name, None, None, None, [], {}
        )
        for r in resources
        if r.custom
    ]
    policy.validate(StackValidationArgs(policy_resources), lambda message, urn=None: found.append(message))
    return found


_engine_view: dict[str, tuple[list[ResourceValidationArgs], StackValidationArgs]] = {}


def engine_view(graph: Graph) -> tuple[list[ResourceValidationArgs], StackValidationArgs]:
    """What the engine would hand the pack for this graph: each resource's inputs, every resource's outputs."""
    if graph.stack not in _engine_view:
        custom = [r for r in graph.resources if r.custom]
        resource_args = [
            ResourceValidationArgs(
                r.type, unknown_checking_proxy(r.inputs), r.urn, r.name, policy_options(r), None
            )
            for r in custom
        ]
        stack_args = StackValidationArgs(
            [
                PolicyResource(
                    r.type,
                    unknown_checking_proxy(r.outputs),
                    r.urn,
                    r.name,
                    policy_options(r),
                    None,
                    None,
                    [],
                    {},
                )
                for r in custom
            ]
        )
        _engine_view[graph.stack] = (resource_args, stack_args)
    return _engine_view[graph.stack]


def graph_violations(policy, graph: Graph) -> list[str]:
    found: list[str] = []
    resource_args, stack_args = engine_view(graph)
    if isinstance(policy, StackValidationPolicy):
        policy.validate(stack_args, lambda message, urn=None: found.append(message))
    else:
        for args in resource_args:
            policy.validate(args, lambda message, urn=None: found.append(message))
    return found


def changed(resource: Resource, change, *, outputs: bool = False) -> Resource:
    """The resource with ``change(props)`` applied to a copy of its inputs (or outputs)."""
    props = copy.deepcopy(resource.outputs if outputs else resource.inputs)
    change(props)
    if outputs:
        return Resource(resource.type, resource.name, resource.urn, resource.id, resource.inputs, props, True)
    return Resource(resource.type, resource.name, resource.urn, resource.id, props, resource.outputs, True)


def setter(path: tuple, value: Any):
    def change(props: dict) -> None:
        target = props
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return change


def deleter(key: str):
    return lambda props: props.pop(key)


def named(graph: Graph, typ: str, suffix: str) -> Resource:
    return graph.one(typ, f"{graph.stack}-{suffix}")


def bucket_config(graph: Graph, kind: str, purpose: str) -> Resource:
    [bucket] = [
        b for b in graph.of_type("aws:s3/bucket:Bucket") if b.inputs["tags"]["frontier:purpose"] == purpose
    ]
    [found] = [
        c
        for c in graph.of_type(f"aws:s3/bucket{kind}:Bucket{kind}")
        if c.outputs["bucket"] == bucket.outputs["bucket"]
    ]
    return found


def replace_in_stack(graph: Graph, original: Resource, replacement: Resource | None) -> list[Resource]:
    resources = [r for r in graph.resources if r is not original]
    return resources + ([replacement] if replacement else [])


def runtime_policy_with(statement: dict):
    def change(props: dict) -> None:
        document = json.loads(props["policy"])
        document["Statement"].append(statement)
        props["policy"] = json.dumps(document)

    return change


LT, TG, LB = (
    "aws:ec2/launchTemplate:LaunchTemplate",
    "aws:lb/targetGroup:TargetGroup",
    "aws:lb/loadBalancer:LoadBalancer",
)
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
LISTENER, ASG = "aws:lb/listener:Listener", "aws:autoscaling/group:Group"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
RUNTIME_DEPLOYMENT = "runtime-deployment-frontier-llama-3-1-70b-instruct"
CONTAINER = ("spec", "template", "spec", "containers", 0)
_eks_graph: list[Graph] = []
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
WAF_ASSOCIATION = "aws:wafv2/webAclAssociation:WebAclAssociation"
REPLICATION = "aws:s3/bucketReplicationConfig:BucketReplicationConfig"
LISTENER_RULE = "aws:lb/listenerRule:ListenerRule"
K8S_INGRESS = "kubernetes:networking.k8s.io/v1:Ingress"
RUNTIME_INGRESS = "runtime-ingress-frontier-llama-3-1-70b-instruct"
RUNTIME_SERVICE = "runtime-service-frontier-llama-3-1-70b-instruct"
INGRESS_PATH = ("spec", "rules", 0, "http", "paths", 0, "path")
# In place of a change of properties: the resource without protect (its own option, or its parent's).
UNPROTECTED = object()


@pytest.fixture
def eks_prod() -> Graph:
    """The Kubernetes stack's program under mocks (see k8s_mocks), built once."""
    if not _eks_graph:
        from k8s_mocks import run_kubernetes

        from frontier.targets import load_stack

        _eks_graph.append(run_kubernetes(load_stack("eks-prod")))
    return _eks_graph[0]


# rule -> (stack, the program's resource, its violating change)
RESOURCE_VIOLATIONS = {
    "kms-key-rotation": ("dev", ("aws:kms/key:Key", "secrets-key"), setter(("enableKeyRotation",), False)),
    "ecr-immutable-tags": (
        "dev",
        ("aws:ecr/repository:Repository", "registry-runtime"),
        setter(("imageTagMutability",), "MUTABLE"),
    ),
    "ecr-scan-on-push": (
        "dev",
        ("aws:ecr/repository:Repository", "registry-runtime"),
        setter(("imageScanningConfiguration", "scanOnPush"), False),
    ),
    "imdsv2-required": ("prod", (LT, "h100-lt"), setter(("metadataOptions", "httpTokens"), "optional")),
    "ebs-encrypted": (
        "prod",
        (LT, "h100-lt"),
        setter(("blockDeviceMappings", 0, "ebs", "encrypted"), "false"),
    ),
    "no-public-ip-on-hosts": (
        "prod",
        (LT, "h100-lt"),
        setter(("networkInterfaces", 0, "associatePublicIpAddress"), "true"),
    ),
    "secrets-use-kms": ("dev", ("aws:secretsmanager/secret:Secret", "secrets-api-keys"), deleter("kmsKeyId")),
    "no-public-ingress": (
        "staging",
        (INGRESS, "sg-runtime-ssh-from-bastion"),
        lambda p: (p.pop("referencedSecurityGroupId"), p.update(cidrIpv4="0.0.0.0/0")),
    ),
    "no-wildcard-iam-on-data": (
        "dev",
        ("aws:iam/rolePolicy:RolePolicy", "iam-runtime"),
        runtime_policy_with({"Effect": "Allow", "Action": "s3:*", "Resource": "*"}),
    ),
    "alb-http-redirects-to-https": (
        "dev",
        (LISTENER, "edge-http"),
        setter(("defaultActions",), [{"type": "forward", "targetGroupArn": "tg"}]),
    ),
    "alb-tls-1-2": ("dev", (LISTENER, "edge-https"), setter(("sslPolicy",), "ELBSecurityPolicy-2016-08")),
    "lb-access-logs": ("dev", (LB, "edge-alb"), setter(("accessLogs", "enabled"), False)),
    "lb-deletion-protection": ("prod", (LB, "edge-alb"), setter(("enableDeletionProtection",), False)),
    "log-groups-encrypted-with-retention": (
        "dev",
        ("aws:cloudwatch/logGroup:LogGroup", "monitoring-runtime"),
        deleter("kmsKeyId"),
    ),
    "asg-discovery-tags": (
        "dev",
        (ASG, "a10g-asg"),
        lambda p: p.update(tags=[t for t in p["tags"] if t["key"] != "frontier:role"]),
    ),
    "asg-launch-hook": (
        "prod",
        (ASG, "h100-asg"),
        lambda p: p.update(
            initialLifecycleHooks=[
                h for h in p["initialLifecycleHooks"] if "LAUNCHING" not in h["lifecycleTransition"]
            ]
        ),
    ),
    "asg-waits-for-capacity": ("dev", (ASG, "a10g-asg"), setter(("waitForCapacityTimeout",), "0")),
    "production-targets-https": ("prod", (TG, "edge-tg"), setter(("protocol",), "HTTP")),
    "alb-forwards-only-api": (
        "dev",
        (LISTENER, "edge-https"),
        setter(("defaultActions",), [{"type": "forward", "targetGroupArn": "tg"}]),
    ),
    "k8s-images-by-digest": (
        "eks_prod",
        (DEPLOYMENT, RUNTIME_DEPLOYMENT),
        setter((*CONTAINER, "image"), "123456789012.dkr.ecr.us-east-1.amazonaws.com/frontier-runtime:latest"),
    ),
    "k8s-no-privileged-pods": (
        "eks_prod",
        (DEPLOYMENT, RUNTIME_DEPLOYMENT),
        setter((*CONTAINER, "securityContext", "privileged"), True),
    ),
    "k8s-gpu-requests-equal-limits": (
        "eks_prod",
        (DEPLOYMENT, RUNTIME_DEPLOYMENT),
        setter((*CONTAINER, "resources", "limits", "nvidia.com/gpu"), "4"),
    ),
    "iam-no-account-admin": (
        "dev",
        ("aws:iam/rolePolicy:RolePolicy", "iam-runtime"),
        runtime_policy_with({"Effect": "Allow", "Action": "iam:PassRole", "Resource": "*"}),
    ),
    "resource-policies-not-public": (
        "staging",
        ("aws:s3/bucketPolicy:BucketPolicy", "storage-weights"),
        runtime_policy_with({"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": "*"}),
    ),
    "production-stateful-protected": ("prod", ("aws:s3/bucket:Bucket", "storage-weights"), UNPROTECTED),
    "eks-private-endpoint": (
        "eks_prod",
        ("aws:eks/cluster:Cluster", "eks-cluster"),
        setter(("vpcConfig", "endpointPublicAccess"), True),
    ),
    "launch-template-block-devices": ("prod", (LT, "h100-lt"), deleter("blockDeviceMappings")),
    "alb-listener-rules-forward-only-api": (
        "prod",
        (LISTENER_RULE, "edge-api"),
        setter(("conditions", 0, "pathPattern", "values"), ["/*"]),
    ),
    "k8s-ingress-forwards-only-api": ("eks_prod", (K8S_INGRESS, RUNTIME_INGRESS), setter(INGRESS_PATH, "/*")),
    "production-ingress-deletion-protection": (
        "eks_prod",
        (K8S_INGRESS, RUNTIME_INGRESS),
        setter(("metadata", "annotations", ALB_ATTRIBUTES), "idle_timeout.timeout_seconds=300"),
    ),
    "production-ingress-allowlisted": (
        "eks_prod",
        (K8S_INGRESS, RUNTIME_INGRESS),
        lambda props: props["metadata"]["annotations"].pop("alb.ingress.kubernetes.io/wafv2-acl-arn"),
    ),
    "k8s-services-not-exposed": (
        "eks_prod",
        ("kubernetes:core/v1:Service", RUNTIME_SERVICE),
        setter(("spec", "type"), "LoadBalancer"),
    ),
    "k8s-containers-hardened": (
        "eks_prod",
        (DEPLOYMENT, RUNTIME_DEPLOYMENT),
        setter((*CONTAINER, "securityContext", "readOnlyRootFilesystem"), False),
    ),
    "k8s-containers-limited": (
        "eks_prod",
        (DEPLOYMENT, RUNTIME_DEPLOYMENT),
        setter((*CONTAINER, "resources", "limits"), {"cpu": "16"}),
    ),
}


def _runtime_ingress_from_a_range(graph: Graph) -> list[Resource]:
    rule = named(graph, INGRESS, f"sg-runtime-{TARGET_TLS_PORT}-from-alb")
    # A private range passes no-public-ingress; only this rule sees that hosts trust an address, not a group.
    widened = changed(
        rule, lambda p: (p.pop("referencedSecurityGroupId"), p.update(cidrIpv4="10.0.0.0/8")), outputs=True
    )
    return replace_in_stack(graph, rule, widened)


def _sg_rule_changed(typ: str, suffix: str, **changes: Any):
    """The stack with one of the program's security group rules changed (``None`` removes a key)."""

    def change(props: dict) -> None:
        props.pop("referencedSecurityGroupId", None)
        for key, value in changes.items():
            if value is None:
                props.pop(key, None)
            else:
                props[key] = value

    def violate(graph: Graph) -> list[Resource]:
        original = named(graph, typ, f"sg-{suffix}")
        return replace_in_stack(graph, original, changed(original, change, outputs=True))

    return violate


def _egress_changed(suffix: str, **changes: Any):
    return _sg_rule_changed(EGRESS, suffix, **changes)


def _ingress_changed(suffix: str, **changes: Any):
    return _sg_rule_changed(INGRESS, suffix, **changes)


def _without(kind: str, purpose: str):
    return lambda graph: replace_in_stack(graph, bucket_config(graph, kind, purpose), None)


def _changed_config(kind: str, purpose: str, change):
    def violate(graph: Graph) -> list[Resource]:
        original = bucket_config(graph, kind, purpose)
        return replace_in_stack(graph, original, changed(original, change, outputs=True))

    return violate


def _policy_without_tls_deny(props: dict) -> None:
    document = json.loads(props["policy"])
    document["Statement"] = [s for s in document["Statement"] if s["Effect"] != "Deny"]
    props["policy"] = json.dumps(document)


# rule -> [(description, stack, the program's resources with one violation)]
STACK_VIOLATIONS = {
    "s3-encrypted": [
        ("no encryption config", "dev", _without("ServerSideEncryptionConfiguration", "access-logs")),
        (
            "weights on S3-managed keys",
            "dev",
            _changed_config(
                "ServerSideEncryptionConfiguration",
                "weights",
                setter(("rules", 0, "applyServerSideEncryptionByDefault"), {"sseAlgorithm": "AES256"}),
            ),
        ),
    ],
    "s3-weights-versioned": [
        ("no versioning", "prod", _without("Versioning", "weights")),
        (
            "versioning suspended",
            "prod",
            _changed_config(
                "Versioning", "history", setter(("versioningConfiguration", "status"), "Suspended")
            ),
        ),
    ],
    "s3-public-access-blocked": [
        (
            "public policies allowed",
            "staging",
            _changed_config("PublicAccessBlock", "history", setter(("blockPublicPolicy",), False)),
        ),
    ],
    "s3-tls-only": [
        ("no TLS deny", "staging", _changed_config("Policy", "weights", _policy_without_tls_deny))
    ],
    "runtime-ingress-from-security-groups": [("an address range", "prod", _runtime_ingress_from_a_range)],
    "k8s-pdb-and-network-policy-per-workload": [
        ("no disruption budget", "eks_prod", lambda g: _without_kubernetes(g, "PodDisruptionBudget")),
        (
            "only the default deny",
            "eks_prod",
            lambda g: _without_kubernetes(g, "NetworkPolicy", keep="default-deny"),
        ),
    ],
    "runtime-egress-not-anywhere": [
        (
            "SSH out to anywhere",
            "staging",
            _egress_changed("runtime-out-443-vpc", fromPort=22, toPort=22, cidrIpv4="0.0.0.0/0"),
        ),
        (
            "every port to ::/0",
            "staging",
            _egress_changed("runtime-out-443-vpc", ipProtocol="-1", cidrIpv6="::/0", cidrIpv4=None),
        ),
    ],
    "runtime-web-egress-to-anywhere": [
        ("HTTPS to anywhere", "staging", _egress_changed("runtime-out-443-vpc", cidrIpv4="0.0.0.0/0"))
    ],
    "public-ingress-only-to-load-balancer": [
        (
            "runtime port from anywhere",
            "prod",
            _ingress_changed(f"runtime-{TARGET_TLS_PORT}-from-alb", cidrIpv4="0.0.0.0/0"),
        ),
        ("the ALB on another port", "prod", _ingress_changed("alb-443", fromPort=9443, toPort=9443)),
    ],
    "lb-redirect-port-public": [("the program's own redirect port", "prod", lambda g: list(g.resources))],
    "production-lb-allowlisted": [
        ("open to anywhere without its WAF", "prod", lambda g: _without_waf(g.resources))
    ],
    "production-runtime-egress-to-endpoints": [
        ("HTTPS to anywhere", "prod", _egress_changed("runtime-out-443-vpc", cidrIpv4="0.0.0.0/0"))
    ],
    "production-backup-copy": [
        ("no backup region", "prod", lambda g: [r for r in g.resources if r.type != REPLICATION]),
        (
            "deletions replicated",
            "prod",
            _changed_config(
                "ReplicationConfig",
                "history",
                setter(("rules", 0, "deleteMarkerReplication", "status"), "Enabled"),
            ),
        ),
    ],
}


def _without_waf(resources: list[Resource]) -> list[Resource]:
    return [r for r in resources if r.type != WAF_ASSOCIATION]


def _without_kubernetes(graph: Graph, kind: str, keep: str = "") -> list[Resource]:
    """The graph less every object of ``kind`` (but the one named ``keep``)."""
    return [
        r
        for r in graph.resources
        if not (r.type.endswith(f":{kind}") and r.inputs["metadata"]["name"] != keep)
    ]


def test_every_rule_has_a_violation_case():
    # The quota store's rule needs a gateway stack that provisions one: its violation cases are in
    # tests/infra/test_quota_store.py (test_the_cache_rule_fires_on_a_store_left_open).
    elsewhere = {p.name for p in quota_store.POLICIES}
    assert elsewhere == {"cache-encrypted-with-auth"}
    resource_rules = {p.name for p in POLICIES if isinstance(p, ResourceValidationPolicy)}
    assert set(RESOURCE_VIOLATIONS) == resource_rules - elsewhere
    assert set(STACK_VIOLATIONS) == {p.name for p in POLICIES if isinstance(p, StackValidationPolicy)}
    assert all(isinstance(p, ResourceValidationPolicy | StackValidationPolicy) for p in POLICIES)


def test_known_breaks_are_advisory():
    assert all(BY_NAME[name].enforcement_level == EnforcementLevel.ADVISORY for name in KNOWN_BREAKS)


def test_rule_names_are_unique():
    assert len(BY_NAME) == len(POLICIES)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_rule_passes_on_the_programs_resources(graph, name):
    assert unexplained(name, graph_violations(BY_NAME[name], graph)) == []


@pytest.mark.parametrize("name", sorted(RESOURCE_VIOLATIONS))
def test_resource_rule_fires_on_a_violating_resource(name, request):
    stack, (typ, suffix), change = RESOURCE_VIOLATIONS[name]
    graph = request.getfixturevalue(stack)
    original = named(graph, typ, suffix)
    violating = with_protect(original, False) if change is UNPROTECTED else changed(original, change)
    violations = resource_violations(BY_NAME[name], violating)
    assert violations and all(v.startswith(f"{original.name}: ") for v in violations)
    assert unexplained(name, resource_violations(BY_NAME[name], original)) == []


@pytest.mark.parametrize(
    ("name", "case"),
    [(n, i) for n, cases in sorted(STACK_VIOLATIONS.items()) for i in range(len(cases))],
    ids=lambda v: v if isinstance(v, str) else str(v),
)
def test_stack_rule_fires_on_a_violating_stack(name, case, request):
    _, stack, violate = STACK_VIOLATIONS[name][case]
    violations = stack_violations(BY_NAME[name], violate(request.getfixturevalue(stack)))
    assert len(violations) == 1


def test_ingress_from_anywhere_to_the_runtime_port_fires(prod):
    rule = named(prod, INGRESS, f"sg-runtime-{TARGET_TLS_PORT}-from-alb")
    violating = changed(rule, lambda p: (p.pop("referencedSecurityGroupId"), p.update(cidrIpv6="::/0")))
    [message] = resource_violations(BY_NAME["no-public-ingress"], violating)
    assert f"::/0 on tcp {TARGET_TLS_PORT}-{TARGET_TLS_PORT}" in message


def test_inline_security_group_rules_are_checked_too(prod):
    sg = named(prod, "aws:ec2/securityGroup:SecurityGroup", "sg-runtime")
    open_ssh = changed(
        sg,
        setter(
            ("ingress",), [{"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]}]
        ),
    )
    assert resource_violations(BY_NAME["no-public-ingress"], open_ssh)


def test_data_actions_on_every_resource_fire_even_without_a_wildcard_action(dev):
    role_policy = named(dev, "aws:iam/rolePolicy:RolePolicy", "iam-runtime")
    violating = changed(
        role_policy,
        runtime_policy_with(
            {"Sid": "ReadEverything", "Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}
        ),
    )
    [message] = resource_violations(BY_NAME["no-wildcard-iam-on-data"], violating)
    assert "ReadEverything" in message and "every resource" in message


def test_a_metadata_hop_limit_beyond_containers_fires(prod):
    lt = named(prod, LT, "h100-lt")
    violating = changed(lt, setter(("metadataOptions", "httpPutResponseHopLimit"), 3.0))
    assert resource_violations(BY_NAME["imdsv2-required"], violating)


def test_deletion_protection_is_only_asked_of_the_configured_production_stacks(staging):
    alb = named(staging, LB, "edge-alb")
    rule = BY_NAME["lb-deletion-protection"]
    assert resource_violations(rule, alb) == []
    assert resource_violations(rule, alb, config={"productionStacks": ["staging"]})


def test_rules_are_mandatory_except_the_advisory_few():
    levels = {p.name: p.enforcement_level for p in POLICIES}
    assert {n for n, level in levels.items() if level == EnforcementLevel.ADVISORY} == ADVISORY
    assert all(level == EnforcementLevel.MANDATORY for n, level in levels.items() if n not in ADVISORY)


def test_the_pack_enforces_every_rule(monkeypatch):
    packs: list[dict] = []
    monkeypatch.setattr(pulumi_policy, "PolicyPack", lambda **kwargs: packs.append(kwargs))
    runpy.run_path(str(POLICY_DIR / "__main__.py"))
    [pack] = packs
    assert pack["name"] == "frontier" and pack["policies"] == POLICIES
    assert pack["enforcement_level"] == EnforcementLevel.MANDATORY


def test_the_pack_runs_in_the_projects_python_environment():
    manifest = yaml.safe_load((POLICY_DIR / "PulumiPolicy.yaml").read_text())
    assert manifest["runtime"]["name"] == "python"
    assert (
        POLICY_DIR / manifest["runtime"]["options"]["virtualenv"]
    ).resolve() == POLICY_DIR.parent / ".venv"


# --- Kubernetes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_rule_passes_on_the_kubernetes_stacks_resources(eks_prod, name):
    assert unexplained(name, graph_violations(BY_NAME[name], eks_prod)) == []


_eks_multinode_graph: list[Graph] = []


@pytest.fixture
def eks_multinode() -> Graph:
    """The stack whose replicas are LeaderWorkerSet groups over two nodes, under mocks, built once."""
    if not _eks_multinode_graph:
        from k8s_mocks import run_kubernetes

        from frontier.targets import load_stack

        _eks_multinode_graph.append(run_kubernetes(load_stack("eks-multinode")))
    return _eks_multinode_graph[0]


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_rule_passes_on_a_leader_worker_set_stacks_resources(eks_multinode, name):
    assert unexplained(name, graph_violations(BY_NAME[name], eks_multinode)) == []


def test_the_pack_checks_a_leader_worker_sets_pods_and_its_budget(eks_multinode):
    resources = engine_view(eks_multinode)[1].resources
    [group] = [r for r in resources if r.resource_type in K8S_LEADER_WORKER_SET]
    assert len(pod_specs(group.resource_type, group.props)) == 2
    assert group.resource_type in {r for r in K8S_WORKLOADS}
    # Its PodDisruptionBudget and NetworkPolicy select its pods (else the pair below names it).
    assert [w for w, _ in check_k8s_pdb_and_network_policy(resources)] == []


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (setter(("spec", "template", "spec", "hostNetwork"), True), "hostNetwork: true"),
        (
            lambda p: p["spec"]["template"]["spec"]["volumes"].append(
                {"name": "host", "hostPath": {"path": "/"}}
            ),
            "hostPath",
        ),
        (
            setter((*CONTAINER, "securityContext", "allowPrivilegeEscalation"), True),
            "allowPrivilegeEscalation",
        ),
        (setter((*CONTAINER, "securityContext", "capabilities"), {"add": ["SYS_ADMIN"]}), "SYS_ADMIN"),
        (
            lambda p: (
                p["spec"]["template"]["spec"]["securityContext"].pop("runAsNonRoot"),
                p["spec"]["template"]["spec"]["containers"][0]["securityContext"].pop("runAsNonRoot"),
            ),
            "may run as root",
        ),
        (setter(("spec", "template", "spec", "securityContext", "runAsUser"), 0), "runAsUser: 0"),
    ],
)
def test_each_way_of_privilege_fires(eks_prod, change, fragment):
    original = named(eks_prod, DEPLOYMENT, RUNTIME_DEPLOYMENT)
    violations = resource_violations(BY_NAME["k8s-no-privileged-pods"], changed(original, change))
    assert len(violations) == 1 and fragment in violations[0]


def test_a_gpu_limit_without_a_request_fires(eks_prod):
    original = named(eks_prod, DEPLOYMENT, RUNTIME_DEPLOYMENT)
    change = lambda p: p["spec"]["template"]["spec"]["containers"][0]["resources"].pop("requests")  # noqa: E731
    (violation,) = resource_violations(BY_NAME["k8s-gpu-requests-equal-limits"], changed(original, change))
    assert "requests None nvidia.com/gpu but is limited to 8" in violation


def test_an_init_container_by_tag_fires_too(eks_prod):
    original = named(eks_prod, DEPLOYMENT, RUNTIME_DEPLOYMENT)
    change = setter(
        ("spec", "template", "spec", "initContainers"), [{"name": "fetch", "image": "busybox:1.36"}]
    )
    (violation,) = resource_violations(BY_NAME["k8s-images-by-digest"], changed(original, change))
    assert "'fetch' runs 'busybox:1.36'" in violation


def test_a_launch_hook_that_continues_by_default_fires(prod):
    asg = named(prod, ASG, "h100-asg")

    def continue_by_default(props):
        for hook in props["initialLifecycleHooks"]:
            hook["defaultResult"] = "CONTINUE"

    [message] = resource_violations(BY_NAME["asg-launch-hook"], changed(asg, continue_by_default))
    assert "continues by default" in message


# --- exposure: IAM scope, resource policies, network reach, protection, EKS ------------------------


def _with_statement(resource: Resource, key: str, statement: dict) -> Resource:
    def change(props: dict) -> None:
        document = json.loads(props[key])
        document["Statement"].append(statement)
        props[key] = json.dumps(document)

    return changed(resource, change)


@pytest.mark.parametrize("action", ["iam:PassRole", "iam:Pass*", "iam:*", "sts:*", "*"])
def test_account_administering_actions_on_every_resource_fire(dev, action):
    role_policy = named(dev, "aws:iam/rolePolicy:RolePolicy", "iam-runtime")
    statement = {"Sid": "Escalates", "Effect": "Allow", "Action": action, "Resource": "*"}
    [message] = resource_violations(
        BY_NAME["iam-no-account-admin"], _with_statement(role_policy, "policy", statement)
    )
    assert message.startswith(f"{role_policy.name}: ") and "Escalates" in message and repr(action) in message


def test_passing_one_named_role_is_allowed(dev):
    role_policy = named(dev, "aws:iam/rolePolicy:RolePolicy", "iam-runtime")
    statement = {
        "Effect": "Allow",
        "Action": "iam:PassRole",
        "Resource": "arn:aws:iam::123456789012:role/frontier-runtime",
    }
    assert (
        resource_violations(
            BY_NAME["iam-no-account-admin"], _with_statement(role_policy, "policy", statement)
        )
        == []
    )


@pytest.mark.parametrize("principal", ["*", {"AWS": "*"}, {"AWS": ["arn:aws:iam::123456789012:root", "*"]}])
def test_a_trust_policy_of_anyone_fires(dev, principal):
    role = named(dev, "aws:iam/role:Role", "iam-runtime")
    statement = {"Effect": "Allow", "Principal": principal, "Action": "sts:AssumeRole"}
    [message] = resource_violations(
        BY_NAME["iam-no-account-admin"], _with_statement(role, "assumeRolePolicy", statement)
    )
    assert message.startswith(f"{role.name}: trust policy")


@pytest.mark.parametrize("policy", ["AdministratorAccess", "PowerUserAccess", "IAMFullAccess"])
def test_attached_aws_managed_admin_policies_fire(eks_prod, policy):
    rule = BY_NAME["iam-no-account-admin"]
    [attachment, *_] = eks_prod.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    arn = f"arn:aws:iam::aws:policy/{policy}"
    [message] = resource_violations(rule, changed(attachment, setter(("policyArn",), arn)))
    assert message == f"{attachment.name}: attaches the AWS managed policy {policy}"
    role = named(eks_prod, "aws:iam/role:Role", "eks-node")
    assert resource_violations(rule, changed(role, setter(("managedPolicyArns",), [arn])))


PUBLIC_READ = {"Sid": "Anyone", "Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "*", "Resource": "*"}


def test_a_key_policy_open_to_anyone_fires_unless_a_condition_narrows_it(prod):
    key = named(prod, "aws:kms/key:Key", "secrets-key")
    rule = BY_NAME["resource-policies-not-public"]
    [message] = resource_violations(rule, _with_statement(key, "policy", PUBLIC_READ))
    assert message.startswith(f"{key.name}: resource policy statement Anyone")
    narrowed = {**PUBLIC_READ, "Condition": {"StringEquals": {"aws:PrincipalAccount": "123456789012"}}}
    assert resource_violations(rule, _with_statement(key, "policy", narrowed)) == []


@pytest.mark.parametrize(
    "typ", ["aws:secretsmanager/secretPolicy:SecretPolicy", "aws:ecr/repositoryPolicy:RepositoryPolicy"]
)
def test_secret_and_repository_policies_open_to_anyone_fire(typ):
    policy = json.dumps({"Version": "2012-10-17", "Statement": [PUBLIC_READ]})
    resource = Resource(
        typ, "prod-open", f"urn:pulumi:prod::frontier::{typ}::prod-open", "x", {"policy": policy}, {}, True
    )
    [message] = resource_violations(BY_NAME["resource-policies-not-public"], resource)
    assert message.startswith("prod-open: ")


def test_production_protection_follows_the_configured_stacks(staging):
    bucket = named(staging, "aws:s3/bucket:Bucket", "storage-weights")
    rule = BY_NAME["production-stateful-protected"]
    assert resource_violations(rule, with_protect(bucket, False)) == []
    assert resource_violations(rule, with_protect(bucket, False), config={"productionStacks": ["staging"]})


@pytest.mark.parametrize(
    ("typ", "suffix"),
    [("aws:kms/key:Key", "secrets-key"), ("aws:secretsmanager/secret:Secret", "secrets-api-keys")],
)
def test_unprotected_production_keys_and_secrets_fire(prod, typ, suffix):
    original = named(prod, typ, suffix)
    assert resource_violations(BY_NAME["production-stateful-protected"], original) == []
    assert resource_violations(BY_NAME["production-stateful-protected"], with_protect(original, False))


def test_an_unprotected_production_cluster_fires(eks_prod):
    cluster = named(eks_prod, "aws:eks/cluster:Cluster", "eks-cluster")
    [message] = resource_violations(BY_NAME["production-stateful-protected"], with_protect(cluster, False))
    assert message.startswith(f"{cluster.name}: stateful resource of production stack 'eks-prod'")


def test_a_protected_production_repository_passes(prod):
    repository = named(prod, "aws:ecr/repository:Repository", "registry-runtime")
    assert resource_violations(BY_NAME["production-stateful-protected"], with_protect(repository, True)) == []


def test_an_unprotected_production_repository_is_refused(prod):
    repository = named(prod, "aws:ecr/repository:Repository", "registry-runtime")
    assert resource_violations(BY_NAME["production-stateful-protected"], with_protect(repository, False))


def test_an_endpoint_left_at_the_eks_default_is_public(eks_prod):
    cluster = named(eks_prod, "aws:eks/cluster:Cluster", "eks-cluster")
    change = lambda p: p["vpcConfig"].pop("endpointPublicAccess")  # noqa: E731
    assert resource_violations(BY_NAME["eks-private-endpoint"], changed(cluster, change))


@pytest.mark.parametrize("paths", [["/"], ["/metrics"], []])
def test_listener_rules_forwarding_more_than_the_api_fire(prod, paths):
    rule = named(prod, LISTENER_RULE, "edge-api")
    change = setter(("conditions",), [{"pathPattern": {"values": paths}}] if paths else [])
    assert resource_violations(BY_NAME["alb-listener-rules-forward-only-api"], changed(rule, change))


def test_an_ingress_of_api_paths_alone_passes_and_a_default_backend_fires(eks_prod):
    ingress = named(eks_prod, K8S_INGRESS, RUNTIME_INGRESS)
    rule = BY_NAME["k8s-ingress-forwards-only-api"]
    assert resource_violations(rule, changed(ingress, setter(INGRESS_PATH, "/v1/"))) == []
    backend = {"service": {"name": "frontier", "port": {"name": "http"}}}
    api_only_with_default = changed(
        ingress, lambda p: (setter(INGRESS_PATH, "/v1/")(p), p["spec"].update(defaultBackend=backend))
    )
    [message] = resource_violations(rule, api_only_with_default)
    assert "default backend" in message


def test_a_node_port_service_fires(eks_prod):
    service = named(eks_prod, "kubernetes:core/v1:Service", RUNTIME_SERVICE)
    [message] = resource_violations(
        BY_NAME["k8s-services-not-exposed"], changed(service, setter(("spec", "type"), "NodePort"))
    )
    assert "NodePort" in message


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda p: p["spec"]["template"]["spec"]["securityContext"].pop("seccompProfile"), "seccomp"),
        (setter((*CONTAINER, "securityContext", "seccompProfile"), {"type": "Unconfined"}), "seccomp"),
        (
            lambda p: p["spec"]["template"]["spec"]["containers"][0]["securityContext"].pop(
                "readOnlyRootFilesystem"
            ),
            "writable root",
        ),
    ],
)
def test_each_missing_hardening_fires(eks_prod, change, fragment):
    original = named(eks_prod, DEPLOYMENT, RUNTIME_DEPLOYMENT)
    [message] = resource_violations(BY_NAME["k8s-containers-hardened"], changed(original, change))
    assert fragment in message


def test_containers_with_cpu_and_memory_limits_pass(eks_prod):
    original = named(eks_prod, DEPLOYMENT, RUNTIME_DEPLOYMENT)
    limits = setter(
        (*CONTAINER, "resources", "limits"), {"cpu": "32", "memory": "512Gi", "nvidia.com/gpu": "8"}
    )
    assert resource_violations(BY_NAME["k8s-containers-limited"], changed(original, limits)) == []


def test_an_inline_egress_rule_of_the_runtime_group_fires(prod):
    sg = named(prod, "aws:ec2/securityGroup:SecurityGroup", "sg-runtime")
    open_egress = changed(
        sg,
        setter(("egress",), [{"protocol": "-1", "fromPort": 0, "toPort": 0, "cidrBlocks": ["0.0.0.0/0"]}]),
        outputs=True,
    )
    [message] = stack_violations(
        BY_NAME["runtime-egress-not-anywhere"], replace_in_stack(prod, sg, open_egress)
    )
    assert message.startswith(f"{sg.name}: runtime hosts may send -1")


def test_only_the_runtime_groups_egress_is_confined(prod):
    # Only runtime hosts are confined: the rule is about what a compromised runtime could send out.
    rule = named(prod, EGRESS, f"sg-alb-to-runtime-{TARGET_TLS_PORT}")
    widened = changed(
        rule, lambda p: (p.pop("referencedSecurityGroupId"), p.update(cidrIpv4="0.0.0.0/0")), outputs=True
    )
    assert (
        stack_violations(BY_NAME["runtime-egress-not-anywhere"], replace_in_stack(prod, rule, widened)) == []
    )


# --- closed doors on production stacks, each both ways ---------------------------------------------


def _alb_rules_narrowed(graph: Graph, cidr: str) -> list[Resource]:
    """The stack with the ALB's listener rules admitting ``cidr`` instead of everyone."""
    resources = list(graph.resources)
    for port in (443, 80):
        rule = named(graph, INGRESS, f"sg-alb-{port}")
        resources = [r for r in resources if r is not rule]
        resources.append(changed(rule, setter(("cidrIpv4",), cidr), outputs=True))
    return resources


def test_an_allowlisted_production_balancer_needs_no_waf(prod):
    narrowed = _without_waf(_alb_rules_narrowed(prod, "203.0.113.0/24"))
    assert stack_violations(BY_NAME["production-lb-allowlisted"], narrowed) == []


def test_an_internal_production_balancer_needs_no_allowlist(prod):
    alb = named(prod, LB, "edge-alb")
    internal = changed(alb, setter(("internal",), True), outputs=True)
    resources = [internal if r is alb else r for r in _without_waf(prod.resources)]
    assert stack_violations(BY_NAME["production-lb-allowlisted"], resources) == []


def test_an_open_balancer_is_refused_only_on_the_configured_production_stacks(staging):
    rule, resources = BY_NAME["production-lb-allowlisted"], list(staging.resources)
    assert not staging.of_type(WAF_ASSOCIATION)
    assert stack_violations(rule, resources) == []
    found: list[str] = []
    rule.validate(
        StackValidationArgs(_policy_resources(resources), {"productionStacks": ["staging"]}),
        lambda message, urn=None: found.append(message),
    )
    [message] = found
    assert (
        message.startswith("staging-edge-alb: internet-facing load balancer")
        and "edge.allow_cidrs" in message
    )


def test_a_plain_http_target_group_passes_outside_production(dev):
    tg = changed(named(dev, TG, "edge-tg"), setter(("protocol",), "HTTP"))
    assert resource_violations(BY_NAME["production-targets-https"], tg) == []
    assert resource_violations(BY_NAME["production-targets-https"], tg, config={"productionStacks": ["dev"]})


def test_a_plain_http_health_check_on_production_fires(prod):
    tg = changed(named(prod, TG, "edge-tg"), setter(("healthCheck", "protocol"), "HTTP"))
    [message] = resource_violations(BY_NAME["production-targets-https"], tg)
    assert "health over plain HTTP" in message


def test_web_egress_to_anywhere_is_refused_on_production_and_reported_elsewhere(staging, prod):
    refuse, report = (
        BY_NAME["production-runtime-egress-to-endpoints"],
        BY_NAME["runtime-web-egress-to-anywhere"],
    )
    for graph in (staging, prod):
        opened = _egress_changed("runtime-out-443-vpc", cidrIpv4="0.0.0.0/0")(graph)
        assert len(stack_violations(report, opened)) == 1
        assert len(stack_violations(refuse, opened)) == (1 if graph is prod else 0)


def _policy_resources(resources: list[Resource]) -> list[PolicyResource]:
    return [
        PolicyResource(
            r.type, unknown_checking_proxy(copy.deepcopy(r.outputs)), r.urn, r.name, None, None, None, [], {}
        )
        for r in resources
        if r.custom
    ]
