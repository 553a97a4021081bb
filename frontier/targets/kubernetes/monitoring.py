"""Monitoring on Kubernetes: the runtime's scrape (ServiceMonitor) and alerts (PrometheusRule), the GPUs'
metrics (NVIDIA's DCGM exporter), the resource alerts, the routes by severity (AlertmanagerConfig)
and the Grafana dashboard.

The alerts are the same rules ``fab render`` writes for every stack (``templates/alerts.yaml.j2``,
from the stack's SLOs), handed to the Prometheus Operator. They select the runtime by
``job="frontier-runtime"``: the ServiceMonitor takes its job name from the Service's
``app.kubernetes.io/name`` label, which is exactly that, so one set of rules serves every target.
Here every selector also names the stack's namespace (:func:`stack_scope`): one Prometheus usually
scrapes a cluster's every namespace, and another stack's runtimes carry the same job.
"""

from __future__ import annotations

from typing import Any

import yaml
from frontier_hostside.names import K8S_APP_LABEL, K8S_INSTANCE_LABEL, K8S_MANAGED_BY_LABEL

from frontier.alarms import Scope
from frontier.config.schema import SEVERITIES, NodePool, PoolSettings, Settings, Severity
from frontier.errors import FrontierError
from frontier.render.alerts import render_alerts, render_resource_alerts
from frontier.render.dashboards import render_grafana_dashboard
from frontier.targets.kubernetes.objects import (
    Manifest,
    app_labels,
    app_name,
    kubernetes_of,
    selector,
    stack_labels,
)


def service_monitor(settings: Settings, pool: PoolSettings) -> Manifest:
    """What Prometheus scrapes of ``pool``'s runtimes (a half of a disaggregated pool, or the pool)."""
    k = kubernetes_of(settings)
    body = {
        "spec": {
            "jobLabel": K8S_APP_LABEL,
            "selector": {"matchLabels": selector(pool)},
            "namespaceSelector": {"matchNames": [k.namespace]},
            "endpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "scheme": "http",
                    "interval": f"{k.monitoring.scrape_interval_s}s",
                }
            ],
        }
    }
    return Manifest(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        app_name(pool),
        k.namespace,
        body,
        labels={**app_labels(pool), **k.monitoring.service_monitor_labels},
    )


def stack_scope(settings: Settings) -> Scope:
    """This stack's series in a Prometheus that may scrape other stacks' namespaces too."""
    return Scope(namespace=kubernetes_of(settings).namespace)


def prometheus_rule(settings: Settings, pool: PoolSettings) -> Manifest:
    """The stack's alerting rules (one set for every pool: the rules select by metric, not by pod),
    named and labelled after ``pool``'s workload, which carries them."""
    k = kubernetes_of(settings)
    return _alert_rule(
        settings,
        f"{app_name(pool)}-alerts",
        k.namespace,
        render_alerts(settings, stack_scope(settings)),
        app_labels(pool),
    )


def _alert_rule(
    settings: Settings, name: str, namespace: str, alerts: str, labels: dict[str, str]
) -> Manifest:
    """A PrometheusRule of the groups of ``alerts`` (an alerts file as ``fab render`` writes it)."""
    k = kubernetes_of(settings)
    return Manifest(
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        name,
        namespace,
        {"spec": {"groups": yaml.safe_load(alerts)["groups"]}},
        # The operator selects rules by the same labels as ServiceMonitors in common setups.
        labels={**labels, **k.monitoring.service_monitor_labels},
    )


# --- GPU metrics: NVIDIA's DCGM exporter ----------------------------------------------------------

# The standalone exporter, not the GPU Operator: the EKS NVIDIA AMI (and most managed GPU node images)
# already bring the driver, the container toolkit and the device plugin, which the Operator would
# want to manage too. Pinned by digest: a new exporter is a reviewed change of these two lines, never
# a pull of a tag that can move. The digest is DCGM_TAG's linux/amd64 manifest as operators running it
# on p5 and B300 nodes publish it (the GPU node groups are x86_64; an arm64 node would need the
# index's digest, which `crane digest nvcr.io/nvidia/k8s/dcgm-exporter:<DCGM_TAG>` prints). DCGM 4.4+
# is what B300s need; H100s and H200s run it too.
DCGM_TAG = "4.5.2-4.8.1-ubuntu22.04"
DCGM_DIGEST = "sha256:a7ad6547d4546eaf4dd5d6b4c0b4db4101e63ef7dc3cdff7f42b767d2c60b706"
DCGM_IMAGE = f"nvcr.io/nvidia/k8s/dcgm-exporter@{DCGM_DIGEST}"
DCGM_NAME = "frontier-dcgm-exporter"
DCGM_PORT = 9400
# The kubelet's pod-resources socket: the exporter labels each GPU's series with the pod using it.
POD_RESOURCES = "/var/lib/kubelet/pod-resources"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


def gpu_pools(settings: Settings) -> list[tuple[NodePool, tuple[str, ...]]]:
    """The node pools with GPUs, each with the instance types its nodes may have."""
    k = kubernetes_of(settings)
    groups = {g.name: g for g in settings.node_groups}
    found = []
    for pool in k.node_pools:
        group = groups.get(pool.node_group)
        if group is not None and group.accelerator == "gpu":
            found.append((pool, pool.instance_types or (group.instance_type,)))
    return found


def _tolerations(pool: NodePool) -> list[dict[str, Any]]:
    """Tolerations of every taint of ``pool``: the exporter runs wherever the runtime may."""
    return [
        {"key": t.key, "operator": "Equal", "value": t.value, "effect": t.effect}
        if t.value
        else {"key": t.key, "operator": "Exists", "effect": t.effect}
        for t in pool.taints
    ]


def _dcgm_labels() -> dict[str, str]:
    return {K8S_APP_LABEL: "dcgm-exporter", K8S_INSTANCE_LABEL: DCGM_NAME, K8S_MANAGED_BY_LABEL: "frontier"}


# What checkov (`make scan`) would refuse on the exporter's DaemonSet, each with why DCGM needs it. They
# travel as annotations on that object only, so every other workload is held to every check.
DCGM_CHECKOV_EXCEPTIONS = {
    "CKV_K8S_39": "profiling metrics (DCGM_FI_PROF_*) need CAP_SYS_ADMIN; NVIDIA documents no narrower capability",
    "CKV_K8S_25": "SYS_ADMIN is the one capability added, for the profiling counters; ALL others are dropped",
    "CKV_K8S_23": "root: a capability added to a non-root user never reaches its effective set, and the kubelet "
    "pod-resources socket is root-only",
    "CKV_K8S_40": "uid 0 for the same reason as CKV_K8S_23: the capability and the root-only kubelet socket",
}


def checkov_skips(exceptions: dict[str, str]) -> dict[str, str]:
    """``checkov.io/skipN: CHECK=reason`` annotations: checkov splits on ``=``, so a reason holds none."""
    for check, reason in exceptions.items():
        if "=" in reason or not reason.strip():
            raise ValueError(f"{check}: a checkov exception needs a reason without '=': {reason!r}")
    return {
        f"checkov.io/skip{i}": f"{check}={reason}" for i, (check, reason) in enumerate(exceptions.items(), 1)
    }


def node_agent_probes(path: str, port: int, *, start_s: int) -> dict[str, Any]:
    """A node agent's health over HTTP (the GPU exporter's, the log shipper's): ready while ``path``
    answers; restarted only after three misses in a row, half a minute apart, from ``start_s`` on."""
    return {
        "readinessProbe": {"httpGet": {"path": path, "port": port}, "periodSeconds": 15},
        "livenessProbe": {
            "httpGet": {"path": path, "port": port},
            "initialDelaySeconds": start_s,
            "periodSeconds": 30,
            "failureThreshold": 3,
        },
    }


def root_agent_security(*added: str) -> dict[str, Any]:
    """A node agent that runs as root (each says why in its checkov exceptions): no escalation, not
    privileged, a read-only image, the runtime's seccomp profile, and no capability but ``added``."""
    capabilities: dict[str, list[str]] = {"drop": ["ALL"]}
    if added:
        capabilities["add"] = list(added)
    return {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        "capabilities": capabilities,
    }


def dcgm_exporter(settings: Settings) -> list[Manifest]:
    """A DaemonSet on every GPU node, its Service and its ServiceMonitor (none without GPU pools).

    They live in the Prometheus stack's namespace: the exporter needs the host's pod-resources socket
    and SYS_ADMIN for profiling counters, which the runtime's namespace (restricted pod security)
    never admits.
    """
    pools = gpu_pools(settings)
    if not pools:
        return []
    k = kubernetes_of(settings)
    ns, labels = k.monitoring.prometheus_namespace, _dcgm_labels()
    types = sorted({t for _, pool_types in pools for t in pool_types})
    tolerations = []
    for pool, _ in pools:
        for toleration in _tolerations(pool):
            if toleration not in tolerations:
                tolerations.append(toleration)
    container = {
        "name": "dcgm-exporter",
        "image": DCGM_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "env": [
            {"name": "DCGM_EXPORTER_LISTEN", "value": f":{DCGM_PORT}"},
            {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
            # Every GPU of the node, through the NVIDIA container runtime, without claiming one.
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        ],
        "ports": [{"name": "metrics", "containerPort": DCGM_PORT, "protocol": "TCP"}],
        # The embedded host engine takes a while to enumerate the GPUs: restart only a hung exporter.
        **node_agent_probes("/health", DCGM_PORT, start_s=60),
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "500m", "memory": "512Mi"},
        },
        # Root with SYS_ADMIN and nothing else (see DCGM_CHECKOV_EXCEPTIONS). no_new_privs still holds:
        # the API server refuses allowPrivilegeEscalation false only beside the spelling CAP_SYS_ADMIN,
        # and a root process keeps the capabilities it starts with.
        "securityContext": root_agent_security("SYS_ADMIN"),
        "volumeMounts": [
            {"name": "pod-resources", "mountPath": POD_RESOURCES, "readOnly": True},
            # Where the embedded host engine writes (its log, scratch files): the image stays read-only.
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "log", "mountPath": "/var/log"},
        ],
    }
    daemon_set = Manifest(
        "apps/v1",
        "DaemonSet",
        DCGM_NAME,
        ns,
        {
            "spec": {
                "selector": {"matchLabels": dict(labels)},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {
                        "automountServiceAccountToken": False,
                        "priorityClassName": "system-node-critical",
                        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                        "tolerations": tolerations,
                        "affinity": {
                            "nodeAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": {
                                    "nodeSelectorTerms": [
                                        {
                                            "matchExpressions": [
                                                {
                                                    "key": INSTANCE_TYPE_LABEL,
                                                    "operator": "In",
                                                    "values": types,
                                                }
                                            ]
                                        }
                                    ]
                                }
                            }
                        },
                        "containers": [container],
                        "volumes": [
                            {
                                "name": "pod-resources",
                                "hostPath": {"path": POD_RESOURCES, "type": "Directory"},
                            },
                            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                            {"name": "log", "emptyDir": {"sizeLimit": "64Mi"}},
                        ],
                    },
                },
            }
        },
        labels=labels,
        annotations=checkov_skips(DCGM_CHECKOV_EXCEPTIONS),
    )
    service = Manifest(
        "v1",
        "Service",
        DCGM_NAME,
        ns,
        {
            "spec": {
                "type": "ClusterIP",
                "selector": dict(labels),
                "ports": [{"name": "metrics", "port": DCGM_PORT, "targetPort": "metrics", "protocol": "TCP"}],
            }
        },
        labels=labels,
    )
    monitor = Manifest(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        DCGM_NAME,
        ns,
        {
            "spec": {
                "jobLabel": K8S_APP_LABEL,
                "selector": {"matchLabels": dict(labels)},
                "namespaceSelector": {"matchNames": [ns]},
                "endpoints": [
                    {
                        "port": "metrics",
                        "path": "/metrics",
                        "scheme": "http",
                        "interval": f"{k.monitoring.scrape_interval_s}s",
                        # Series by the node they come from, as the node exporter's.
                        "relabelings": [
                            {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
                        ],
                    }
                ],
            }
        },
        labels={**labels, **k.monitoring.service_monitor_labels},
    )
    return [daemon_set, service, monitor]


def resource_rule(settings: Settings) -> Manifest:
    """The GPU and host alerts, beside the exporters they read."""
    return _alert_rule(
        settings,
        f"frontier-{settings.stack}-resource-alerts",
        kubernetes_of(settings).monitoring.prometheus_namespace,
        render_resource_alerts(settings),
        stack_labels(),
    )


# --- routes by severity: Alertmanager ---------------------------------------------------------------

# How long an alert group waits for more alerts, and how often a firing one is sent again.
GROUP_WAIT = "30s"
GROUP_INTERVAL = "5m"
REPEAT_INTERVAL = {"page": "1h", "warn": "4h", "info": "24h"}


def receiver_name(severity: Severity) -> str:
    return f"frontier-{severity}"


def alertmanager_config(settings: Settings) -> Manifest:
    """Routes by the ``severity`` label of this stack's alerts (both rule sets carry ``stack``) to one
    receiver per severity, with the stack's ``alerts.routes``; resolved alerts are sent too.

    The Alertmanager must not add its default namespace matcher (its
    ``alertmanagerConfigMatcherStrategy`` is ``None``): the resource alerts are raised in the
    Prometheus stack's namespace, and the SLO rules aggregate the namespace label away.
    """
    k = kubernetes_of(settings)
    receivers = []
    for severity in SEVERITIES:
        where = f"alerts.routes.{severity}"
        route = settings.alert_route(severity)
        if route.sqs_queue_arns:
            raise FrontierError(
                f"{settings.source}: {where}.sqs_queue_arns = {list(route.sqs_queue_arns)}: Alertmanager "
                "cannot deliver to SQS; on Kubernetes give emails or https_endpoints"
            )
        receiver: dict[str, Any] = {"name": receiver_name(severity)}
        if route.emails:
            receiver["emailConfigs"] = [{"to": address, "sendResolved": True} for address in route.emails]
        if route.https_endpoints:
            receiver["webhookConfigs"] = [{"url": url, "sendResolved": True} for url in route.https_endpoints]
        receivers.append(receiver)
    body = {
        "spec": {
            "route": {
                # Anything of this stack that no severity route takes (a rule without one) is info.
                "receiver": receiver_name("info"),
                "matchers": [{"name": "stack", "value": settings.stack, "matchType": "="}],
                "groupBy": ["alertname", "alarm"],
                "groupWait": GROUP_WAIT,
                "groupInterval": GROUP_INTERVAL,
                "repeatInterval": REPEAT_INTERVAL["info"],
                "routes": [
                    {
                        "receiver": receiver_name(severity),
                        "matchers": [{"name": "severity", "value": severity, "matchType": "="}],
                        "repeatInterval": REPEAT_INTERVAL[severity],
                    }
                    for severity in SEVERITIES
                ],
            },
            "receivers": receivers,
        }
    }
    return Manifest(
        "monitoring.coreos.com/v1alpha1",
        "AlertmanagerConfig",
        # One per stack, whichever model pool renders it: the same object, never a second route.
        f"frontier-{settings.stack}-alert-routes",
        k.namespace,
        body,
        labels={**stack_labels(), **k.monitoring.service_monitor_labels},
    )


# --- the dashboard ----------------------------------------------------------------------------------

# The label the Grafana of kube-prometheus-stack loads dashboards from ConfigMaps by.
GRAFANA_DASHBOARD_LABEL = "grafana_dashboard"


def dashboard_config_map(settings: Settings) -> Manifest:
    k = kubernetes_of(settings)
    name = f"frontier-{settings.stack}-dashboard"
    return Manifest(
        "v1",
        "ConfigMap",
        name,
        k.monitoring.prometheus_namespace,
        {
            "data": {
                f"frontier-{settings.stack}.json": render_grafana_dashboard(settings, stack_scope(settings))
            }
        },
        labels={**stack_labels(), GRAFANA_DASHBOARD_LABEL: "1"},
    )


def monitoring_objects(settings: Settings) -> list[Manifest]:
    """What the Prometheus stack needs beyond the runtime's own ServiceMonitor and rules: the GPU
    exporter, the resource alerts, the routes by severity and the dashboard."""
    return [
        *dcgm_exporter(settings),
        resource_rule(settings),
        alertmanager_config(settings),
        dashboard_config_map(settings),
    ]
