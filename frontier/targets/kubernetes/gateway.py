"""The gateway on Kubernetes: one Deployment in front of the stack's model pools.

A stack with a ``gateway:`` section and several ``models:`` runs one runtime Deployment per pool
(:func:`frontier.targets.kubernetes.manifests.render_workload`, each for its pool,
:func:`workloads`) and this gateway in front of them. Choices worth knowing:

- **Its own image** (``kubernetes.gateway_image``, pinned by digest): the runtime image carries
  CUDA and torch but not ``frontier-gateway``, and the gateway needs neither. It runs the
  ``frontier-gateway`` entry point of ``gateway/pyproject.toml``.
- **Its config** is ``gateway.yaml`` exactly as other targets render it
  (:func:`frontier.access.gateway.render_gateway_config`), each colocated pool's replicas found by
  its Service's EndpointSlices (:func:`discoveries`): the gateway balances, routes by KV events and
  migrates among the pods themselves, each at its ready endpoint's address; a pool at zero pods has
  no replica, so the gateway holds its requests (``gateway.hold``). For that it lists EndpointSlices
  in the namespace (its Role, :func:`discovery_access`) with a token projected into its container
  alone (:func:`api_access_volume`), over the HTTPS egress it has already. A disaggregated pool's
  two hops go to its halves' Services. The admin listener (``/metrics``) binds every address here: the
  pod's loopback is unreachable for Prometheus, so the NetworkPolicy admits the admin port from
  Prometheus only, and the Service names it for the ServiceMonitor alone (the Ingress forwards to
  the public port).
- **Named by content**: the ConfigMap is ``frontier-gateway-config-<hash>`` (immutable) and the pod
  template names it, so a changed config is a changed template and the Deployment rolls: surge one
  pod, wait for it to be ready, retire one (``maxUnavailable: 0``), under a disruption budget of
  one. Everything in ``gateway.yaml`` comes from the stack file, so ``pulumi up`` applies and rolls
  it; ``fab deploy`` rolls model pools only.
- **Keys** are read as on EC2: tenants' digests and the runtimes' key from Secrets Manager, with the
  credentials of the gateway's own service account (``frontier-gateway``; its IAM role is made by
  the Pulumi program, or named by ``kubernetes.gateway_role_arn`` on an existing cluster).
- **Placement**: untainted nodes (the GPU pools' taints keep it off GPU nodes; on a created cluster
  that is the system node group), spread over zones and nodes.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from frontier_hostside.names import (
    K8S_APP_LABEL,
    K8S_CONFIG_HASH_ANNOTATION,
    K8S_INSTANCE_LABEL,
    K8S_MANAGED_BY_LABEL,
    LIVENESS_PATH,
    METRICS_PATH,
    READINESS_PATH,
)

from frontier.access.gateway import render_gateway_config
from frontier.config.schema import Gateway, PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.targets.kubernetes import disaggregation as pd
from frontier.targets.kubernetes.objects import (
    RESTRICTED_CONTAINER,
    TEMPLATE_HASH_ANNOTATION,
    Manifest,
    app_name,
    config_hash,
    http_probe,
    kubernetes_of,
)
from frontier.targets.kubernetes.rbac import Rule, role_for

GATEWAY_NAME = "frontier-gateway"
GATEWAY_SERVICE_ACCOUNT = "frontier-gateway"
GATEWAY_CONFIG_FILE = "gateway.yaml"
GATEWAY_CONFIG_DIR = "/etc/frontier/gateway"
# Every address: the pod's loopback is not reachable by Prometheus (see the module docstring).
ALL_ADDRESSES = "0.0.0.0"
# A gateway proxies streams; it needs little CPU and memory per request. Requests equal limits:
# the pod is Guaranteed, never the first evicted under node pressure.
GATEWAY_RESOURCES = {"cpu": "1", "memory": "1Gi"}
GRACE_S = 30
# The gateway's API access (its pools' EndpointSlices): where a pod's token is looked for, and how
# long a projected one lives before the kubelet renews it (the kubelet's own default).
API_ACCESS_VOLUME = "kube-api-access"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_EXPIRATION_S = 3607


def gateway_of(settings: Settings) -> Gateway:
    if settings.gateway is None:
        raise FrontierError(f"stack {settings.stack!r} has no 'frontier:gateway' section")
    return settings.gateway


def gateway_labels() -> dict[str, str]:
    return {K8S_APP_LABEL: GATEWAY_NAME, K8S_INSTANCE_LABEL: GATEWAY_NAME, K8S_MANAGED_BY_LABEL: "frontier"}


def gateway_selector() -> dict[str, str]:
    return {K8S_APP_LABEL: GATEWAY_NAME, K8S_INSTANCE_LABEL: GATEWAY_NAME}


def workload_pools(settings: Settings) -> list[PoolSettings]:
    """The pools the runtime workloads run, one runtime Deployment each: one per model pool, a
    disaggregated pool's two halves in its place (:mod:`.disaggregation`)."""
    return [half for pool in settings.pools for half in pd.role_pools(pool)]


def service_url(settings: Settings, pool: PoolSettings) -> str:
    """A pool's (or a half's) Service: its cluster DNS name at its runtime's port."""
    namespace = kubernetes_of(settings).namespace
    return f"http://{app_name(pool)}.{namespace}.svc.cluster.local:{pool.runtime.port}"


def upstreams(settings: Settings) -> dict[str, list[str]]:
    """Each pool's one upstream: its Service; a disaggregated pool's decode Service, the colocated
    fallback (a decode replica computes the prompt itself)."""
    return {pool.name: [service_url(settings, pd.role_pools(pool)[-1])] for pool in settings.pools}


def disaggregated_upstreams(settings: Settings) -> dict[str, dict[str, list[str]]]:
    """Each disaggregated pool's two hops: its prefill Service and its decode Service."""
    return {
        pool.name: {half: [service_url(settings, pd.role_pool(pool, half))] for half in pd.HALVES}
        for pool in settings.pools
        if pool.disaggregation is not None
    }


def discoveries(settings: Settings) -> dict[str, dict[str, Any]]:
    """Each colocated pool's pods, found by its Service's EndpointSlices (the gateway's
    ``KubernetesDiscovery``), so the gateway routes, balances and migrates among pods, not through
    one Service address. A disaggregated pool's two hops stay its halves' Services."""
    namespace = kubernetes_of(settings).namespace
    return {
        pool.name: {"namespace": namespace, "service": app_name(pool), "port": pool.runtime.port}
        for pool in settings.pools
        if pool.disaggregation is None
    }


def discovery_rules() -> tuple[Rule, ...]:
    """What the gateway asks the API server: its pools' EndpointSlices, listed; nothing else."""
    return (Rule("discovery.k8s.io", "endpointslices", ("list",)),)


def discovery_access(settings: Settings) -> tuple[Manifest, Manifest]:
    """The gateway's Role (:func:`discovery_rules`) in the stack's namespace, bound to its service account."""
    namespace = kubernetes_of(settings).namespace
    account = {"kind": "ServiceAccount", "name": GATEWAY_SERVICE_ACCOUNT, "namespace": namespace}
    return role_for(f"{GATEWAY_NAME}-discovery", namespace, discovery_rules(), account, gateway_labels())


def gateway_yaml(settings: Settings) -> str:
    """``gateway.yaml`` as every target renders it, with the admin listener on every address."""
    gw = gateway_of(settings)
    here = settings.model_copy(update={"gateway": gw.model_copy(update={"admin_host": ALL_ADDRESSES})})
    return render_gateway_config(
        here,
        upstreams(settings),
        disaggregated=disaggregated_upstreams(settings),
        discoveries=discoveries(settings),
    )


def config_map_name(config_text: str) -> str:
    return f"{GATEWAY_NAME}-config-{config_hash(config_text)[:10]}"


def config_map(settings: Settings, config_text: str) -> Manifest:
    return Manifest(
        "v1",
        "ConfigMap",
        config_map_name(config_text),
        kubernetes_of(settings).namespace,
        {"immutable": True, "data": {GATEWAY_CONFIG_FILE: config_text}},
        labels=gateway_labels(),
        annotations={K8S_CONFIG_HASH_ANNOTATION: f"sha256:{config_hash(config_text)}"},
    )


def service_account(settings: Settings, role_arn: Any = None) -> Manifest:
    """The gateway's identity: it reads tenants' keys and writes metering with its own IAM role."""
    k = kubernetes_of(settings)
    annotations: dict[str, Any] = {}
    if k.identity == "irsa":
        annotations["eks.amazonaws.com/role-arn"] = role_arn or k.gateway_role_arn
    return Manifest(
        "v1",
        "ServiceAccount",
        GATEWAY_SERVICE_ACCOUNT,
        k.namespace,
        {"automountServiceAccountToken": False},
        labels=gateway_labels(),
        annotations=annotations,
    )


def image(settings: Settings) -> str:
    k = kubernetes_of(settings)
    if not k.gateway_image:
        raise FrontierError(
            f"stack {settings.stack!r}: kubernetes.gateway_image is empty; a gateway needs its image "
            "(<repository>@sha256:<64 hex>)"
        )
    return k.gateway_image


def pod_template(settings: Settings, config_text: str) -> dict[str, Any]:
    k, gw = kubernetes_of(settings), gateway_of(settings)
    container = {
        "name": GATEWAY_NAME,
        "image": image(settings),
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "frontier-gateway",
            "serve",
            "--config",
            f"{GATEWAY_CONFIG_DIR}/{GATEWAY_CONFIG_FILE}",
            "--host",
            ALL_ADDRESSES,
        ],
        "ports": [
            {"name": "http", "containerPort": gw.port, "protocol": "TCP"},
            {"name": "admin", "containerPort": gw.admin_port, "protocol": "TCP"},
        ],
        "env": [
            {"name": "AWS_REGION", "value": settings.region},
            {"name": "AWS_DEFAULT_REGION", "value": settings.region},
        ],
        "resources": {"requests": dict(GATEWAY_RESOURCES), "limits": dict(GATEWAY_RESOURCES)},
        # Ready while every pool has a ready replica or a hold queue; live while the process answers.
        "readinessProbe": http_probe(settings, READINESS_PATH, settings.health.unhealthy_threshold),
        "livenessProbe": http_probe(settings, LIVENESS_PATH, max(3, settings.health.unhealthy_threshold)),
        # The load balancer keeps sending for its deregistration delay; the gateway serves through it.
        "lifecycle": {
            "preStop": {"exec": {"command": ["sleep", str(settings.rollout.deregistration_delay_s)]}}
        },
        "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
        "volumeMounts": [
            {"name": "config", "mountPath": GATEWAY_CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            # The service account's token for the EndpointSlices it lists, and nothing mounted
            # where it is not needed: the automatic mount stays off.
            {"name": API_ACCESS_VOLUME, "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True},
        ],
    }
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": gateway_selector()},
        }
        for key in ("topology.kubernetes.io/zone", "kubernetes.io/hostname")
    ]
    spec = {
        "serviceAccountName": GATEWAY_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": settings.rollout.deregistration_delay_s
        + int(gw.request_timeout_s)
        + GRACE_S,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": k.run_as_user,
            "runAsGroup": k.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "topologySpreadConstraints": spread,
        "containers": [container],
        "volumes": [
            {
                "name": "config",
                "configMap": {
                    "name": config_map_name(config_text),
                    "items": [{"key": GATEWAY_CONFIG_FILE, "path": GATEWAY_CONFIG_FILE}],
                },
            },
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
            api_access_volume(),
        ],
    }
    annotations = {K8S_CONFIG_HASH_ANNOTATION: f"sha256:{config_hash(config_text)}"}
    template = {"metadata": {"labels": gateway_labels(), "annotations": annotations}, "spec": spec}
    annotations[TEMPLATE_HASH_ANNOTATION] = hashlib.sha256(
        json.dumps(template, sort_keys=True).encode()
    ).hexdigest()[:16]
    return template


def api_access_volume() -> dict[str, Any]:
    """What the kubelet's automatic mount would give, made explicit for the gateway's container
    alone: a token bound to the pod (renewed on disk before it expires), the cluster's CA and the
    namespace."""
    return {
        "name": API_ACCESS_VOLUME,
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_S}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]
                    }
                },
            ],
        },
    }


def deployment(settings: Settings, config_text: str) -> Manifest:
    """The gateway's Deployment: ``gateway.desired_size`` replicas, rolled one surge pod at a time."""
    k, gw = kubernetes_of(settings), gateway_of(settings)
    body = {
        "spec": {
            "replicas": gw.desired_size,
            "selector": {"matchLabels": gateway_selector()},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "progressDeadlineSeconds": k.progress_deadline_s,
            "revisionHistoryLimit": settings.rollout.keep_releases,
            "minReadySeconds": settings.health.interval_s,
            "template": pod_template(settings, config_text),
        }
    }
    return Manifest("apps/v1", "Deployment", GATEWAY_NAME, k.namespace, body, labels=gateway_labels())


def service(settings: Settings) -> Manifest:
    gw = gateway_of(settings)
    ports = [
        {"name": "http", "port": gw.port, "targetPort": "http", "protocol": "TCP"},
        {"name": "admin", "port": gw.admin_port, "targetPort": "admin", "protocol": "TCP"},
    ]
    body = {"spec": {"type": "ClusterIP", "selector": gateway_selector(), "ports": ports}}
    return Manifest(
        "v1", "Service", GATEWAY_NAME, kubernetes_of(settings).namespace, body, labels=gateway_labels()
    )


def disruption_budget(settings: Settings) -> Manifest:
    """Node drains take one gateway pod at a time."""
    body = {"spec": {"maxUnavailable": 1, "selector": {"matchLabels": gateway_selector()}}}
    return Manifest(
        "policy/v1",
        "PodDisruptionBudget",
        GATEWAY_NAME,
        kubernetes_of(settings).namespace,
        body,
        labels=gateway_labels(),
    )


def service_monitor(settings: Settings) -> Manifest:
    """The gateway's ``/metrics`` (admin port): tenants' traffic, and each pool's held requests,
    which KEDA reads to start a pool at zero."""
    k = kubernetes_of(settings)
    body = {
        "spec": {
            "jobLabel": K8S_APP_LABEL,
            "selector": {"matchLabels": gateway_selector()},
            "namespaceSelector": {"matchNames": [k.namespace]},
            "endpoints": [
                {
                    "port": "admin",
                    "path": METRICS_PATH,
                    "scheme": "http",
                    "interval": f"{k.monitoring.scrape_interval_s}s",
                }
            ],
        }
    }
    return Manifest(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        GATEWAY_NAME,
        k.namespace,
        body,
        labels={**gateway_labels(), **k.monitoring.service_monitor_labels},
    )
