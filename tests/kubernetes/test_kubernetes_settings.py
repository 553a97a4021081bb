"""The ``target`` field and the ``kubernetes`` block: bad values fail at load, naming field, value, range."""

from __future__ import annotations

import pytest

from frontier.config.load import available_stacks
from frontier.errors import StackError
from frontier.targets import load_stack

DIGEST = "sha256:" + "ab" * 32


def _refused(path, field: str) -> str:
    with pytest.raises(StackError) as err:
        load_stack("eks-prod", path=path)
    lines = [line.strip() for line in str(err.value).splitlines() if line.strip().startswith(field + " ")]
    assert lines, f"no problem names {field!r} in:\n{err.value}"
    return lines[0]


def test_the_eks_stack_loads_with_its_target_and_block(eks_prod):
    assert eks_prod.target == "kubernetes"
    assert eks_prod.kubernetes is not None
    assert eks_prod.kubernetes.cluster.mode == "create"
    assert eks_prod.kubernetes.node_pools[0].node_group == eks_prod.serving_group.name


@pytest.mark.parametrize(("stack", "target"), [("local", "local"), ("dev", "ec2"), ("prod", "ec2")])
def test_the_other_stacks_keep_their_targets(stack, target):
    assert load_stack(stack).target == target


def test_an_unknown_target_is_refused_naming_the_allowed_ones(k8s_stack):
    line = _refused(k8s_stack({"target": "nomad"}), "target")
    assert "'nomad'" in line and "'local', 'ec2' or 'kubernetes'" in line


def test_a_kubernetes_block_needs_the_kubernetes_target(k8s_stack):
    line = _refused(k8s_stack({"target": "ec2"}), "target")
    assert "'ec2'" in line and "must be 'kubernetes'" in line


def test_a_gpu_request_larger_than_a_nodes_gpus_is_refused(k8s_stack):
    # tensor parallel 8 on a 4-GPU instance type: the pod could never schedule.
    line = _refused(
        k8s_stack({"kubernetes.node_pools[0].instance_types": ["p5.48xlarge", "g6e.12xlarge"]}),
        "kubernetes.node_pools[0].instance_types[1]",
    )
    assert "'g6e.12xlarge'" in line
    assert "requests 8 nvidia.com/gpu" in line and "has 4" in line and "at most 4" in line


@pytest.mark.parametrize("name", ["Frontier_Prod", "-prod", "prod-", "a" * 64, "prod.eu"])
def test_a_namespace_that_is_not_a_dns_label_is_refused(k8s_stack, name):
    line = _refused(k8s_stack({"kubernetes.namespace": name}), "kubernetes.namespace")
    assert repr(name) in line and "DNS label (RFC 1123)" in line and "1 to 63" in line


@pytest.mark.parametrize(
    "image",
    [
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/frontier-runtime-eks-prod:latest",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/frontier-runtime-eks-prod:v1.2.0",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/frontier-runtime-eks-prod@sha256:abc",
    ],
)
def test_a_mutable_image_tag_is_refused(k8s_stack, image):
    line = _refused(k8s_stack({"kubernetes.image": image}), "kubernetes.image")
    assert repr(image) in line and "mutable" in line and "@sha256:<64 hex>" in line


def test_an_image_by_digest_from_the_stacks_repository_loads(k8s_stack, eks_prod):
    image = f"{eks_prod.runtime.image_repository}@{DIGEST}"
    settings = load_stack("eks-prod", path=k8s_stack({"kubernetes.image": image}))
    assert settings.kubernetes.image == image


@pytest.mark.parametrize(
    ("field", "value", "named", "allowed"),
    [
        ("kubernetes.cluster.version", "1.24", "kubernetes.cluster.version", "should match pattern"),
        ("kubernetes.cluster.mode", "borrow", "kubernetes.cluster.mode", "'create' or 'existing'"),
        ("kubernetes.ingress.kind", "nginx", "kubernetes.ingress.kind", "'alb' or 'class'"),
        ("kubernetes.autoscaling.max_replicas", 0, "kubernetes.autoscaling.max_replicas", ">= 1"),
        (
            "kubernetes.autoscaling.min_replicas",
            11,
            "kubernetes.autoscaling.min_replicas",
            "<= kubernetes.autoscaling.max_replicas",
        ),
        (
            "kubernetes.autoscaling.max_replicas",
            12,
            "kubernetes.autoscaling.max_replicas",
            "node_groups[0].max_size (10)",
        ),
        (
            "kubernetes.autoscaling.max_replicas",
            9,
            "kubernetes.autoscaling.max_replicas",
            "rollout.max_surge + rollout.canary_hosts = 2 pod(s), so at most node_groups[0].max_size - 2 = 8",
        ),
        (
            "kubernetes.autoscaling.min_replicas",
            1,
            "kubernetes.autoscaling.min_replicas",
            "rollout.batch_size (1)",
        ),
        (
            "kubernetes.node_pools[0].node_group",
            "a100",
            "kubernetes.node_pools[0].node_group",
            "one of node_groups (h100)",
        ),
        (
            "kubernetes.node_pools[0].instance_types",
            ["x9.huge"],
            "kubernetes.node_pools[0].instance_types[0]",
            "GPU count unknown",
        ),
        (
            "kubernetes.node_pools[0].taints",
            [{"key": "gpu", "effect": "Sometimes"}],
            "kubernetes.node_pools[0].taints[0].effect",
            "'NoSchedule'",
        ),
        ("kubernetes.cluster.kubeconfig", "~/.kube/config", "kubernetes.cluster.kubeconfig", "must be empty"),
        ("kubernetes.ingress.kind", "class", "kubernetes.ingress.tls_secret", "TLS Secret"),
    ],
)
def test_bad_kubernetes_values_are_refused_naming_field_value_and_range(
    k8s_stack, field, value, named, allowed
):
    line = _refused(k8s_stack({field: value}), named)
    assert allowed.replace(">= 1", "greater than or equal to 1") in line


def test_an_existing_cluster_needs_kubeconfig_context_and_a_role(k8s_stack):
    path = k8s_stack({"kubernetes.cluster.mode": "existing"})
    assert "both kubeconfig" in _refused(path, "kubernetes.cluster.kubeconfig")
    assert "arn:aws:iam::" in _refused(path, "kubernetes.runtime_role_arn")
    assert "API server" in _refused(path, "kubernetes.cluster.api_server_cidrs")
    assert "subnets it lives in" in _refused(path, "kubernetes.ingress.source_cidrs")
    ok = k8s_stack(
        {
            "kubernetes.cluster.mode": "existing",
            "kubernetes.cluster.kubeconfig": "~/.kube/config",
            "kubernetes.cluster.context": "prod",
            "kubernetes.runtime_role_arn": "arn:aws:iam::123456789012:role/frontier-runtime",
            "kubernetes.cluster.api_server_cidrs": ["10.60.240.0/24"],
            "kubernetes.ingress.source_cidrs": ["10.60.128.0/20"],
        }
    )
    assert load_stack("eks-prod", path=ok).kubernetes.cluster.context == "prod"


# --- what a created cluster could not do ------------------------------------------------------------


def test_a_model_the_gp3_root_volume_cannot_read_within_the_startup_probe_is_refused(k8s_stack):
    # gp3 reads at its baseline 125 MiB/s unless provisioned higher: the 70B model's 141 GB take
    # ~1077 s there, and the startup probe (900 s) restarts the pod before it is ready, forever.
    line = _refused(
        k8s_stack({"kubernetes.node_pools[0].root_volume_throughput_mibps": 125}),
        "kubernetes.node_pools[0].root_volume_throughput_mibps",
    )
    assert "= 125" in line and "141 GB" in line and "125 MiB/s" in line
    assert "takes 1077 s" in line and "allows 900 s" in line
    assert "at least 150 MiB/s (gp3 allows 1000)" in line


def test_a_startup_probe_long_enough_for_the_baseline_gp3_read_loads(k8s_stack):
    # 1080 s of probes cover the 1077 s read at 125 MiB/s.
    path = k8s_stack(
        {"kubernetes.node_pools[0].root_volume_throughput_mibps": 125, "rollout.readiness_timeout_s": 1080}
    )
    assert load_stack("eks-prod", path=path).kubernetes.node_pools[0].root_volume_throughput_mibps == 125


def test_a_throughput_beyond_what_gp3_provisions_is_refused(k8s_stack):
    line = _refused(
        k8s_stack({"kubernetes.node_pools[0].root_volume_throughput_mibps": 4000}),
        "kubernetes.node_pools[0].root_volume_throughput_mibps",
    )
    assert "4000" in line and "less than or equal to 1000" in line


def test_a_private_endpoint_applied_from_outside_the_vpc_is_refused(k8s_stack):
    # The same `pulumi up` applies the add-ons and workloads through the API, which a private-only
    # endpoint serves inside the VPC alone.
    line = _refused(k8s_stack({"kubernetes.cluster.deployer": "outside"}), "kubernetes.cluster.deployer")
    assert "'outside'" in line and "private_endpoint" in line and "'in-vpc'" in line


def test_a_public_endpoint_may_be_applied_from_outside_the_vpc(k8s_stack):
    path = k8s_stack({"kubernetes.cluster.deployer": "outside", "kubernetes.cluster.private_endpoint": False})
    assert load_stack("eks-prod", path=path).kubernetes.cluster.deployer == "outside"


def test_a_system_pool_sized_outside_its_bounds_is_refused(k8s_stack):
    line = _refused(
        k8s_stack({"kubernetes.system_pool": {"desired_size": 5}}), "kubernetes.system_pool.desired_size"
    )
    assert "= 5" in line and "min_size (2) .. max_size (4)" in line


def test_a_gpu_pool_named_like_the_system_pool_is_refused(k8s_stack):
    line = _refused(k8s_stack({"kubernetes.node_pools[0].name": "system"}), "kubernetes.node_pools[0].name")
    assert "'system'" in line and "system node group" in line


def test_a_system_pool_on_an_existing_cluster_is_refused(k8s_stack):
    # Only a created cluster gets the node group; on an existing one the section would do nothing.
    path = k8s_stack(
        {
            "kubernetes.cluster.mode": "existing",
            "kubernetes.cluster.kubeconfig": "~/.kube/config",
            "kubernetes.cluster.context": "prod",
            "kubernetes.cluster.api_server_cidrs": ["10.60.240.0/28"],
            "kubernetes.runtime_role_arn": "arn:aws:iam::123456789012:role/frontier-runtime",
            "kubernetes.ingress.source_cidrs": ["10.60.128.0/20"],
            "kubernetes.system_pool": {"instance_type": "m7i.large"},
        }
    )
    line = _refused(path, "kubernetes.system_pool")
    assert "'m7i.large'" in line and "only a cluster this stack creates" in line


@pytest.mark.parametrize("stack", available_stacks())
def test_every_shipped_stack_loads(stack):
    assert load_stack(stack).stack == stack
