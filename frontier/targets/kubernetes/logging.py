"""The pods' logs on Kubernetes: a Fluent Bit DaemonSet that tails the runtime's and the gateway's
containers on every node and ships them to the stack's CloudWatch log groups, the very groups an EC2
host's CloudWatch agent writes (``/frontier/<stack>/runtime``, ``/frontier/<stack>/gateway``:
:func:`frontier.identity.documents.log_group_name`), one stream per pod.

The shipper reads the container runtime's files under ``/var/log`` (``/var/log/containers/<pod>_<namespace>_<container>-<id>.log``,
links into ``/var/log/pods``) and keeps its read offsets in a directory of the node, so a restarted
shipper neither loses nor repeats lines. It names each stream by the pod from the file's name alone
(``Tag_Regex``), so it never calls the API server: no RBAC, no token. Its AWS identity is a service
account of its own whose role may write streams and events into exactly those groups (made by the
Pulumi program, :mod:`infra.pod_logs`), and its NetworkPolicy lets it out to DNS, HTTPS (CloudWatch
Logs and STS; no fixed addresses to name) and the Pod Identity agent, and in from nothing.

The files are root's (0640) and on the node (hostPath): the runtime's namespace (restricted pod
security) admits neither, so the shipper lives in a namespace of its own, :data:`LOGGING_NAMESPACE`,
and its checkov exceptions travel on its DaemonSet only (:data:`SHIPPER_CHECKOV_EXCEPTIONS`). The
policy pack's ``k8s-no-privileged-pods`` refuses hostPath and root for every workload, so the Pulumi
program applies every logging object but the DaemonSet, which ``fab render`` writes
(``kubernetes/logging/``) for the cluster's operator to apply, as with the GPU exporter.
"""

from __future__ import annotations

from typing import Any

from frontier_hostside.names import (
    CONTAINER_NAME,
    K8S_APP_LABEL,
    K8S_INSTANCE_LABEL,
    K8S_MANAGED_BY_LABEL,
)

from frontier.config.schema import Settings
from frontier.identity.documents import log_group_name
from frontier.targets.kubernetes.gateway import GATEWAY_NAME
from frontier.targets.kubernetes.monitoring import checkov_skips, node_agent_probes, root_agent_security
from frontier.targets.kubernetes.network_policies import common_egress
from frontier.targets.kubernetes.objects import Manifest, kubernetes_of

# aws-for-fluent-bit 2.34.3.20260805, its linux/amd64 image (`crane digest --platform linux/amd64
# public.ecr.aws/aws-observability/aws-for-fluent-bit:2.34.3.20260805`): the nodes are pinned to amd64.
SHIPPER_TAG = "2.34.3.20260805"
SHIPPER_DIGEST = "sha256:d3d6dcd80f23eeb06bc0612285545204a62ffe6feff9dea8a637a8d7236d7c27"
SHIPPER_IMAGE = f"public.ecr.aws/aws-observability/aws-for-fluent-bit@{SHIPPER_DIGEST}"
LOGGING_NAMESPACE = "frontier-logging"
SHIPPER_NAME = "frontier-fluent-bit"
SHIPPER_SERVICE_ACCOUNT = SHIPPER_NAME
# Fluent Bit's own HTTP server: /api/v1/health answers 500 once its outputs keep failing.
HEALTH_PORT = 2020
CONFIG_PATH = "/fluent-bit/etc/frontier"
NODE_LOGS = "/var/log"
STATE_DIR = "/var/fluent-bit/state"
# The file name of a container's log, as the kubelet links it: the pod's name becomes the stream's.
TAG_REGEX = (
    r"(?<pod_name>[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)_(?<namespace_name>[^_]+)_"
    r"(?<container_name>.+)-(?<container_id>[a-z0-9]{64})\.log$"
)

SHIPPER_CHECKOV_EXCEPTIONS = {
    "CKV_K8S_23": "root: the container runtime writes each log file 0640 root and the offsets "
    "directory is root's on the node; every capability is dropped",
    "CKV_K8S_40": "uid 0 for the same reason as CKV_K8S_23: the root-owned log files",
}


def shipped_containers(settings: Settings) -> dict[str, str]:
    """Log group purpose -> the container whose logs go there: the runtime's always, the gateway's
    where the stack has one (the purposes of EC2's groups: infra/monitoring.py)."""
    return {"runtime": CONTAINER_NAME, **({"gateway": GATEWAY_NAME} if settings.gateway is not None else {})}


def shipped_groups(settings: Settings) -> list[str]:
    """The log groups the pods' logs go to: EC2's names for the same purposes."""
    return [log_group_name(settings.stack, purpose) for purpose in shipped_containers(settings)]


def shipper_labels(settings: Settings) -> dict[str, str]:
    return {
        K8S_APP_LABEL: "fluent-bit",
        K8S_INSTANCE_LABEL: f"{SHIPPER_NAME}-{settings.stack}"[:63],
        K8S_MANAGED_BY_LABEL: "frontier",
    }


def fluent_bit_config(settings: Settings) -> str:
    """One tail input per shipped container (tag ``<purpose>.<pod>``) and one CloudWatch output per
    group, the stream named by the tag's pod part."""
    k = kubernetes_of(settings)
    sections = [
        "[SERVICE]\n"
        "    Flush 5\n"
        "    Log_Level info\n"
        "    Daemon off\n"
        "    HTTP_Server On\n"
        "    HTTP_Listen 0.0.0.0\n"
        f"    HTTP_Port {HEALTH_PORT}\n"
        "    Health_Check On\n"
        # Unhealthy after 5 failed flushes in a minute: the liveness probe then restarts it.
        "    HC_Errors_Count 5\n"
        "    HC_Retry_Failure_Count 5\n"
        "    HC_Period 60\n"
    ]
    for purpose, container in shipped_containers(settings).items():
        sections.append(
            "[INPUT]\n"
            "    Name tail\n"
            f"    Path {NODE_LOGS}/containers/*_{k.namespace}_{container}-*.log\n"
            f"    Tag {purpose}.<pod_name>\n"
            f"    Tag_Regex {TAG_REGEX}\n"
            "    multiline.parser cri\n"
            f"    DB {STATE_DIR}/{settings.stack}-{purpose}.db\n"
            "    Mem_Buf_Limit 50MB\n"
            "    Skip_Long_Lines On\n"
            "    Refresh_Interval 10\n"
        )
        sections.append(
            "[OUTPUT]\n"
            "    Name cloudwatch_logs\n"
            f"    Match {purpose}.*\n"
            f"    region {settings.region}\n"
            f"    log_group_name {log_group_name(settings.stack, purpose)}\n"
            # The pod's name (the tag's second part); the prefix only if that could not be read.
            "    log_stream_template $TAG[1]\n"
            f"    log_stream_prefix {purpose}.\n"
            # The group is the Pulumi program's (retention, key): never made here.
            "    auto_create_group false\n"
        )
    return "\n".join(sections)


def namespace(settings: Settings) -> Manifest:
    """Its own namespace: node files and root, which restricted pod security refuses, are admitted
    here alone (warned and audited against restricted all the same)."""
    labels = {
        K8S_MANAGED_BY_LABEL: "frontier",
        "kubernetes.io/metadata.name": LOGGING_NAMESPACE,
        "pod-security.kubernetes.io/enforce": "privileged",
        "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/warn": "restricted",
    }
    return Manifest("v1", "Namespace", LOGGING_NAMESPACE, None, {}, labels=labels)


def service_account(settings: Settings, role_arn: Any = None) -> Manifest:
    """The shipper's identity; with IRSA annotated with its role (Pod Identity associates it instead)."""
    k = kubernetes_of(settings)
    annotations = (
        {"eks.amazonaws.com/role-arn": role_arn} if k.identity == "irsa" and role_arn is not None else {}
    )
    return Manifest(
        "v1",
        "ServiceAccount",
        SHIPPER_SERVICE_ACCOUNT,
        LOGGING_NAMESPACE,
        {"automountServiceAccountToken": False},
        labels=shipper_labels(settings),
        annotations=annotations,
    )


def config_map(settings: Settings) -> Manifest:
    return Manifest(
        "v1",
        "ConfigMap",
        f"{SHIPPER_NAME}-{settings.stack}"[:63],
        LOGGING_NAMESPACE,
        {"data": {"fluent-bit.conf": fluent_bit_config(settings)}},
        labels=shipper_labels(settings),
    )


def daemon_set(settings: Settings) -> Manifest:
    """On every amd64 node, whatever its taints: wherever a runtime or a gateway pod may run."""
    labels = shipper_labels(settings)
    container = {
        "name": "fluent-bit",
        "image": SHIPPER_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/fluent-bit/bin/fluent-bit", "-c", f"{CONFIG_PATH}/fluent-bit.conf"],
        "env": [
            {"name": "AWS_REGION", "value": settings.region},
            {"name": "AWS_DEFAULT_REGION", "value": settings.region},
        ],
        "ports": [{"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"}],
        **node_agent_probes("/api/v1/health", HEALTH_PORT, start_s=30),
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "500m", "memory": "256Mi"},
        },
        # Root for the files (SHIPPER_CHECKOV_EXCEPTIONS), with no capability: a root process reads
        # what root owns without CAP_DAC_OVERRIDE.
        "securityContext": root_agent_security(),
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_PATH, "readOnly": True},
            {"name": "node-logs", "mountPath": NODE_LOGS, "readOnly": True},
            {"name": "state", "mountPath": STATE_DIR},
        ],
    }
    pod = {
        "metadata": {"labels": dict(labels)},
        "spec": {
            "serviceAccountName": SHIPPER_SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "priorityClassName": "system-node-critical",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "tolerations": [{"operator": "Exists"}],
            "nodeSelector": {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"},
            "terminationGracePeriodSeconds": 30,
            "containers": [container],
            "volumes": [
                {"name": "config", "configMap": {"name": config_map(settings).name}},
                {"name": "node-logs", "hostPath": {"path": NODE_LOGS, "type": "Directory"}},
                {"name": "state", "hostPath": {"path": STATE_DIR, "type": "DirectoryOrCreate"}},
            ],
        },
    }
    return Manifest(
        "apps/v1",
        "DaemonSet",
        f"{SHIPPER_NAME}-{settings.stack}"[:63],
        LOGGING_NAMESPACE,
        {
            "spec": {
                "selector": {"matchLabels": dict(labels)},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": pod,
            }
        },
        labels=labels,
        annotations=checkov_skips(SHIPPER_CHECKOV_EXCEPTIONS),
    )


def network_policy(settings: Settings) -> Manifest:
    """In from nothing; out to DNS, HTTPS anywhere but the instance metadata service (CloudWatch Logs
    and STS have no fixed addresses), and the Pod Identity agent where the stack uses it."""
    return Manifest(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        f"{SHIPPER_NAME}-{settings.stack}"[:63],
        LOGGING_NAMESPACE,
        {
            "spec": {
                "podSelector": {"matchLabels": shipper_labels(settings)},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [],
                "egress": common_egress(settings),
            }
        },
        labels=shipper_labels(settings),
    )


def logging_objects(settings: Settings, role_arn: Any = None) -> list[Manifest]:
    """In apply order: the namespace, the identity, the config and the policy before the pods."""
    return [
        namespace(settings),
        service_account(settings, role_arn),
        config_map(settings),
        network_policy(settings),
        daemon_set(settings),
    ]
