"""The pods' log shipper on Kubernetes: a Fluent Bit DaemonSet tailing the runtime's and the gateway's
containers into the stack's CloudWatch log groups, one stream per pod.

Validated with kubernetes-validate (strict: an unknown field fails) for every Kubernetes stack; no API
server runs here, and only a real cluster shows the lines arriving in CloudWatch.
"""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from frontier_hostside.names import CONTAINER_NAME, DIGEST_PATTERN

from frontier import project
from frontier.identity.documents import log_group_name
from frontier.targets import load_stack
from frontier.targets.kubernetes import logging as shipper
from frontier.targets.kubernetes.manifests import manifest_files

DIGEST = "sha256:" + "ab" * 32
EKS_STACKS = sorted(
    name
    for name in (
        p.name.removeprefix("Pulumi.").removesuffix(".yaml")
        for p in project.stacks_dir().glob("Pulumi.*.yaml")
    )
    if load_stack(name).target == "kubernetes"
)


def by_kind(settings) -> dict[str, dict]:
    return {o.kind: o.to_dict() for o in shipper.logging_objects(settings, role_arn="arn:aws:iam::1:role/r")}


def config_sections(text: str) -> list[tuple[str, dict[str, str]]]:
    sections: list[tuple[str, dict[str, str]]] = []
    for line in text.splitlines():
        if line.startswith("["):
            sections.append((line.strip("[]"), {}))
        elif line.strip():
            key, _, value = line.strip().partition(" ")
            sections[-1][1][key] = value.strip()
    return sections


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_every_logging_object_validates_strictly_for_the_clusters_version(stack):
    settings = load_stack(stack)
    assert settings.kubernetes is not None
    for manifest in shipper.logging_objects(settings):
        kubernetes_validate.validate(manifest.to_dict(), settings.kubernetes.cluster.version, strict=True)


def test_the_runtime_is_shipped_to_ec2s_runtime_group_one_stream_per_pod(eks_prod):
    text = by_kind(eks_prod)["ConfigMap"]["data"]["fluent-bit.conf"]
    sections = config_sections(text)
    [tail] = [s for name, s in sections if name == "INPUT"]
    [out] = [s for name, s in sections if name == "OUTPUT"]
    assert tail["Path"] == f"/var/log/containers/*_{eks_prod.kubernetes.namespace}_{CONTAINER_NAME}-*.log"
    assert tail["Tag"] == "runtime.<pod_name>" and "(?<pod_name>" in tail["Tag_Regex"]
    assert out["Match"] == "runtime.*"
    assert (
        out["log_group_name"]
        == log_group_name(eks_prod.stack, "runtime")
        == f"/frontier/{eks_prod.stack}/runtime"
    )
    assert out["log_stream_template"] == "$TAG[1]"  # the pod's name
    assert out["auto_create_group"] == "false"  # the group is Pulumi's, with its retention and key


def test_a_stack_with_a_gateway_ships_the_gateways_container_to_the_gateway_group(eks_gateway):
    sections = config_sections(by_kind(eks_gateway)["ConfigMap"]["data"]["fluent-bit.conf"])
    groups = {s["Match"]: s["log_group_name"] for name, s in sections if name == "OUTPUT"}
    assert groups == {
        "runtime.*": f"/frontier/{eks_gateway.stack}/runtime",
        "gateway.*": f"/frontier/{eks_gateway.stack}/gateway",
    }
    paths = [s["Path"] for name, s in sections if name == "INPUT"]
    assert any("_frontier-gateway-*.log" in p for p in paths)


def test_the_shipper_is_hardened_like_the_gpu_exporter(eks_prod):
    pod = by_kind(eks_prod)["DaemonSet"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    security = container["securityContext"]
    assert DIGEST_PATTERN.match(container["image"].partition("@")[2])
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["allowPrivilegeEscalation"] is False and security["privileged"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["limits"] == {"cpu": "500m", "memory": "256Mi"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/api/v1/health"
    assert pod["automountServiceAccountToken"] is False  # no API server call: pod names from file names
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["node-logs"]["readOnly"] is True and mounts["config"]["readOnly"] is True


def test_the_shipper_runs_wherever_a_runtime_may_whatever_the_taints(eks_prod):
    pod = by_kind(eks_prod)["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["serviceAccountName"] == shipper.SHIPPER_SERVICE_ACCOUNT


def test_checkov_exceptions_sit_on_the_shipper_daemon_set_only_each_with_its_reason(eks_prod):
    objects = shipper.logging_objects(eks_prod)
    skipped = {
        o.kind: [v for k, v in o.annotations.items() if k.startswith("checkov.io/skip")] for o in objects
    }
    assert sorted(c.partition("=")[0] for c in skipped.pop("DaemonSet")) == ["CKV_K8S_23", "CKV_K8S_40"]
    assert all(not v for v in skipped.values())


def test_the_shippers_network_policy_admits_nothing_in_and_only_dns_https_and_the_identity_agent_out(
    eks_prod,
):
    spec = by_kind(eks_prod)["NetworkPolicy"]["spec"]
    assert spec["ingress"] == [] and spec["policyTypes"] == ["Ingress", "Egress"]
    ports = sorted((p["protocol"], p["port"]) for rule in spec["egress"] for p in rule["ports"])
    assert ports == [("TCP", 53), ("TCP", 80), ("TCP", 443), ("UDP", 53)]
    [identity] = [r for r in spec["egress"] if r["ports"] == [{"protocol": "TCP", "port": 80}]]
    assert identity["to"] == [{"ipBlock": {"cidr": "169.254.170.23/32"}}]  # Pod Identity's agent only
    [https] = [r for r in spec["egress"] if r["ports"] == [{"protocol": "TCP", "port": 443}]]
    assert https["to"][0]["ipBlock"]["except"] == ["169.254.169.254/32"]


def test_with_irsa_the_service_account_carries_the_shippers_role(k8s_stack):
    settings = load_stack("eks-prod", path=k8s_stack({"kubernetes.identity": "irsa"}))
    account = shipper.service_account(settings, role_arn="arn:aws:iam::1:role/shipper").to_dict()
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/shipper"}
    assert "annotations" not in shipper.service_account(load_stack("eks-prod"), "arn:x").to_dict()["metadata"]


def test_fab_render_writes_the_logging_objects_in_their_own_folder(eks_prod):
    files = manifest_files(eks_prod, DIGEST)
    logging = {
        path: yaml.safe_load(text) for path, text in files.items() if path.startswith("kubernetes/logging/")
    }
    assert [d["kind"] for d in logging.values()] == [
        "Namespace", "ServiceAccount", "ConfigMap", "NetworkPolicy", "DaemonSet"
    ]  # fmt: skip
    assert all(
        d["metadata"].get("namespace", shipper.LOGGING_NAMESPACE) == shipper.LOGGING_NAMESPACE
        for d in logging.values()
    )
