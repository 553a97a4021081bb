"""Every Kubernetes object of a stack, from its settings and its rendered ``runtime.yaml``.

Plain functions, one per object, each returning a :class:`Manifest`: the Pulumi program turns them
into typed ``pulumi_kubernetes`` resources, ``fab render`` writes them as YAML for GitOps tooling,
and the Kubernetes backend patches the Deployment they describe. Nothing here talks to a cluster.

Choices worth knowing (autoscaling: :mod:`frontier.targets.kubernetes.autoscaling`; network policies:
:mod:`frontier.targets.kubernetes.network_policies`):

- **The ConfigMap is named by its content** (``<app>-config-<hash>``, immutable): a Deployment revision
  names the exact config it ran with, so rolling back to a previous revision brings its config back
  too; the hash is also annotated on the pod template.
- **Termination**: the ALB keeps sending to a terminating pod until its deregistration delay is over,
  so the pod's preStop sleeps that long before the runtime gets SIGTERM; the grace period covers
  the sleep plus the runtime's own drain.
- **Model pools** (a stack's ``models:``): one runtime Deployment per pool, with its own ConfigMap,
  Service, disruption budget, ScaledObject and ServiceMonitor, all rendered from the pool's view of
  the settings (``Settings.for_pool``) and so named ``frontier-<model>``. A pool's ``node_group``
  names a ``node_groups`` entry (its GPUs, sizes, schedule, scale to zero); the pool's pods run on
  the ``kubernetes.node_pools`` entry whose ``node_group`` is that one (its labels select the
  nodes, its taints are tolerated). A node group's sizes stay the one truth of capacity, so a node
  pool never repeats them; two model pools may share a node group (and so a node pool). The
  stack's SLO alerts come once (they select every runtime of the stack).
- **The gateway** (a stack's ``gateway:``): its own Deployment in front of the pools, the Ingress
  pointing at it (:mod:`frontier.targets.kubernetes.gateway`).
- **A replica over several nodes** (a pool's ``runtime.nodes_per_replica`` above 1): a
  LeaderWorkerSet in place of its Deployment, each pod on its own node with its share of the
  replica's GPUs, the Service in front of the leaders only
  (:mod:`frontier.targets.kubernetes.leader_workers`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from frontier_hostside.names import (
    API_PATH_PREFIX,
    CONTAINER_NAME,
    CONTAINER_RELEASE_DIR,
    GPU_RESOURCE,
    JIT_CACHE_DIR,
    JIT_CACHE_ENV,
    JIT_CACHE_MIB,
    K8S_CONFIG_HASH_ANNOTATION,
    K8S_RELEASE_ANNOTATION,
    K8S_TRACK_LABEL,
    READINESS_PATH,
)

from frontier.capacity.gpus import instance_type
from frontier.config.schema import NodePool, PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.release.artifact import is_placeholder
from frontier.render.host import image_reference, render_runtime_config
from frontier.targets.kubernetes import disaggregation as pd
from frontier.targets.kubernetes import gateway as gw
from frontier.targets.kubernetes import leader_workers as lw
from frontier.targets.kubernetes.autoscaling import scaled_object
from frontier.targets.kubernetes.deploy_access import deploy_role
from frontier.targets.kubernetes.logging import logging_objects
from frontier.targets.kubernetes.monitoring import monitoring_objects, prometheus_rule, service_monitor
from frontier.targets.kubernetes.network import ingress_access_annotations
from frontier.targets.kubernetes.network_policies import network_policies
from frontier.targets.kubernetes.objects import (
    CONFIG_FILE,
    RESTRICTED_CONTAINER,
    TEMPLATE_HASH_ANNOTATION,
    Manifest,
    app_labels,
    app_name,
    canary_name,
    config_hash,
    config_map_name,
    http_probe,
    kubernetes_of,
    selector,
    stack_labels,
)
from frontier.targets.kubernetes.probe import probe_cron_job, probe_network_policy

HOME_DIR = "/var/lib/frontier"
IRSA_ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
# Added on top of preStop + the runtime's drain before the kubelet sends SIGKILL.
GRACE_MARGIN_S = 15
TRACKS = ("stable", "canary")


# --- placement ------------------------------------------------------------------------------------


def serving_pool(settings: Settings, pool: PoolSettings) -> NodePool:
    """The node pool ``pool``'s pods run on: the one of its node group."""
    k = kubernetes_of(settings)
    return next(p for p in k.node_pools if p.node_group == pool.group.name)


def gpus_per_pod(pool: PoolSettings) -> int:
    """One pod's GPUs, all on one node: a replica's pipeline stages of max(tensor, expert) parallel
    GPUs each (a stage spans EP GPUs when EP > TP, as the runtime lays it out and the planner
    counts), split evenly over its ``runtime.nodes_per_replica`` pods (the runtime's config refuses a
    split that is not even): the runtime's own ``ranks_per_node``."""
    return pool.runtime.ranks_per_node


def pod_gpus_formula(pool: PoolSettings) -> str:
    """How :func:`gpus_per_pod` counts, with the pool's numbers (for errors)."""
    rt = pool.runtime
    formula = (
        f"pipeline {rt.pipeline_parallel_size} x max(tensor {rt.tensor_parallel_size}, "
        f"expert {rt.expert_parallel_size}) parallel"
    )
    if rt.nodes_per_replica > 1:
        formula = f"{formula} / runtime.nodes_per_replica {rt.nodes_per_replica}"
    return formula


# Of a node's CPU and memory, what the runtime pods may ask for together: the kubelet reserves some,
# the DaemonSets (CNI, kube-proxy, device plugin, agents) request more, and a request above what the
# node can allocate never schedules.
POD_SHARE_OF_NODE = 0.8


def _node_types(settings: Settings, pool: PoolSettings) -> list[tuple[str, str]]:
    """The instance types ``pool``'s pods may run on, each with the stack field that names it."""
    k, group = kubernetes_of(settings), pool.group
    index = next(i for i, p in enumerate(k.node_pools) if p.node_group == group.name)
    node_pool = k.node_pools[index]
    if node_pool.instance_types:
        return [
            (t, f"kubernetes.node_pools[{index}].instance_types[{i}]")
            for i, t in enumerate(node_pool.instance_types)
        ]
    index = next(i for i, g in enumerate(settings.node_groups) if g.name == group.name)
    return [(group.instance_type, f"node_groups[{index}].instance_type")]


def cpu_and_memory(settings: Settings, pool: PoolSettings) -> dict[str, str]:
    """A replica's CPU and memory: its share of the node's GPUs, of the smallest type the pool may use."""
    cpu_m, memory_mi = [], []
    for name, field in _node_types(settings, pool):
        node = instance_type(name, field)
        share = POD_SHARE_OF_NODE * min(1.0, gpus_per_pod(pool) / node.gpus_per_node)
        cpu_m.append(math.floor(node.vcpus * 1000 * share))
        memory_mi.append(math.floor(node.memory_gib * 1024 * share))
    return {"cpu": f"{min(cpu_m)}m", "memory": f"{min(memory_mi)}Mi"}


# --- timing ---------------------------------------------------------------------------------------


def pre_stop_s(settings: Settings) -> int:
    """The ALB keeps routing to a terminating pod for its deregistration delay: serve through it."""
    return settings.rollout.deregistration_delay_s


def grace_period_s(settings: Settings, pool: PoolSettings) -> int:
    return pre_stop_s(settings) + math.ceil(pool.runtime.drain_timeout_s) + GRACE_MARGIN_S


def startup_failure_threshold(settings: Settings) -> int:
    """Probes in rollout.readiness_timeout_s: long enough to fetch and load the model."""
    return max(1, math.ceil(settings.rollout.readiness_timeout_s / settings.health.interval_s))


def strategy(settings: Settings) -> dict[str, Any]:
    """Surge first where the node pool can grow (no replica lost), else batch_size out at once."""
    rollout, group = settings.rollout, settings.serving_group
    can_grow = rollout.max_surge > 0 and group.max_size > group.desired_size
    return {
        "type": "RollingUpdate",
        "rollingUpdate": {
            "maxSurge": rollout.max_surge,
            "maxUnavailable": 0 if can_grow else rollout.batch_size,
        },
    }


# --- objects ----------------------------------------------------------------------------------------


def namespace(settings: Settings) -> Manifest:
    k = kubernetes_of(settings)
    version = f"v{k.cluster.version}"
    labels = {
        **stack_labels(),
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": version,
        "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/warn": "restricted",
    }
    if k.ingress.kind == "alb":
        # The controller holds a pod's readiness until the ALB reports its target healthy, so a
        # rollout never outruns the load balancer.
        labels["elbv2.k8s.aws/pod-readiness-gate-inject"] = "enabled"
    return Manifest("v1", "Namespace", k.namespace, None, {}, labels=labels)


def pool_service_account(settings: Settings, pool: PoolSettings) -> str:
    """The service account ``pool``'s pods run as: ``kubernetes.service_account`` on a one-model
    stack, ``<it>-<model>`` where the file lists its models, so each pool's pods assume a role of
    their own (its weights, secret and history only)."""
    k = kubernetes_of(settings)
    if not settings.listed_models:
        return k.service_account
    return f"{k.service_account}-{re.sub(r'[^a-z0-9-]+', '-', pool.name.lower()).strip('-')}"[:253]


def service_account(settings: Settings, pool: PoolSettings, role_arn: Any = None) -> Manifest:
    """``pool``'s identity. ``role_arn``: a string or a Pulumi Output of one (IRSA only)."""
    k = kubernetes_of(settings)
    annotations: dict[str, Any] = {}
    if k.identity == "irsa":
        annotations[IRSA_ROLE_ANNOTATION] = role_arn or k.runtime_role_arn
    # The runtime never calls the Kubernetes API; Pod Identity and IRSA mount their own tokens.
    body = {"automountServiceAccountToken": False}
    return Manifest(
        "v1",
        "ServiceAccount",
        pool_service_account(settings, pool),
        k.namespace,
        body,
        labels=stack_labels(),
        annotations=annotations,
    )


def config_map(settings: Settings, runtime_yaml: str) -> Manifest:
    k = kubernetes_of(settings)
    return Manifest(
        "v1",
        "ConfigMap",
        config_map_name(settings, runtime_yaml),
        k.namespace,
        {"immutable": True, "data": {CONFIG_FILE: runtime_yaml}},
        labels=app_labels(settings),
        annotations={K8S_CONFIG_HASH_ANNOTATION: f"sha256:{config_hash(runtime_yaml)}"},
    )


def _tolerations(pool: NodePool) -> list[dict[str, Any]]:
    out = []
    for taint in pool.taints:
        toleration: dict[str, Any] = {"key": taint.key, "effect": taint.effect}
        if taint.value:
            toleration.update(operator="Equal", value=taint.value)
        else:
            toleration["operator"] = "Exists"
        out.append(toleration)
    return out


def pod_template(
    settings: Settings, digest: str, runtime_yaml: str, *, track: str, release_id: str = ""
) -> dict[str, Any]:
    k, serving, health = kubernetes_of(settings), settings.only_pool, settings.health
    rt = serving.runtime
    pool = serving_pool(settings, serving)
    gpu = serving.group.accelerator == "gpu"
    # Requests equal to limits: the pod is Guaranteed, never the first evicted under node pressure.
    # (Extended resources such as GPUs cannot be overcommitted anyway: their requests must equal limits.)
    amounts = cpu_and_memory(settings, serving)
    if gpu:
        amounts[GPU_RESOURCE] = str(gpus_per_pod(serving))
    resources: dict[str, Any] = {"requests": dict(amounts), "limits": dict(amounts)}
    annotations = {
        K8S_CONFIG_HASH_ANNOTATION: f"sha256:{config_hash(runtime_yaml)}",
        "kubectl.kubernetes.io/default-container": CONTAINER_NAME,
    }
    if release_id:
        annotations[K8S_RELEASE_ANNOTATION] = release_id
    container = {
        "name": CONTAINER_NAME,
        "image": image_reference(serving, digest),  # the digest is checked there: tags are refused
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "python",
            "-m",
            "frontier_runtime",
            "serve",
            "--config",
            f"{CONTAINER_RELEASE_DIR}/{CONFIG_FILE}",
            *pd.role_arguments(serving),
        ],
        "ports": [{"name": "http", "containerPort": rt.port, "protocol": "TCP"}, *pd.role_ports(serving)],
        "env": [
            *pd.role_env(serving),
            {"name": "AWS_REGION", "value": settings.region},
            {"name": "AWS_DEFAULT_REGION", "value": settings.region},
            {"name": "HOME", "value": HOME_DIR},
            # What Triton, inductor and CUDA compile at first use: into the jit-cache volume.
            *({"name": name, "value": value} for name, value in JIT_CACHE_ENV),
        ],
        "resources": resources,
        "startupProbe": http_probe(settings, health.readiness_path, startup_failure_threshold(settings)),
        "readinessProbe": http_probe(
            settings, health.readiness_path, health.unhealthy_threshold, health.healthy_threshold
        ),
        "livenessProbe": http_probe(settings, health.liveness_path, max(3, health.unhealthy_threshold)),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(pre_stop_s(settings))]}}},
        "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
        "volumeMounts": [
            {"name": "config", "mountPath": CONTAINER_RELEASE_DIR, "readOnly": True},
            {"name": "weights-cache", "mountPath": rt.weights_cache_dir},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "home", "mountPath": HOME_DIR},
            {"name": "jit-cache", "mountPath": JIT_CACHE_DIR},
        ],
    }
    spec: dict[str, Any] = {
        "serviceAccountName": pool_service_account(settings, serving),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace_period_s(settings, serving),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": k.run_as_user,
            "runAsGroup": k.run_as_user,
            "fsGroup": k.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "nodeSelector": dict(pool.labels),
        "tolerations": _tolerations(pool),
        "affinity": {
            # One replica per node: a node's GPUs belong to one replica, and a node lost takes one.
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": selector(settings)},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
        "containers": [container],
        "volumes": [
            {
                "name": "config",
                "configMap": {
                    "name": config_map_name(settings, runtime_yaml),
                    "items": [{"key": CONFIG_FILE, "path": CONFIG_FILE}],
                },
            },
            {"name": "weights-cache", "emptyDir": {"sizeLimit": f"{k.weights_cache_gb}Gi"}},
            # NCCL and the engine's shared tensors need more than the runtime's default 64 MiB.
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{k.shm_gb}Gi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "home", "emptyDir": {"sizeLimit": "1Gi"}},
            # Disk, not memory, and exec (the kubelet mounts emptyDirs so): Triton and inductor load
            # the shared objects they build there.
            {"name": "jit-cache", "emptyDir": {"sizeLimit": f"{JIT_CACHE_MIB}Mi"}},
        ],
    }
    template = {
        "metadata": {"labels": {**app_labels(settings), K8S_TRACK_LABEL: track}, "annotations": annotations},
        "spec": spec,
    }
    shape = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]
    annotations[TEMPLATE_HASH_ANNOTATION] = shape
    return template


def deployment(
    settings: Settings,
    digest: str,
    runtime_yaml: str,
    *,
    track: str = "stable",
    replicas: int | None = None,
    release_id: str = "",
) -> Manifest:
    """The runtime's Deployment; ``replicas`` None leaves the count to the autoscaler."""
    if track not in TRACKS:
        raise FrontierError(f"track {track!r}: expected one of {', '.join(TRACKS)}")
    k = kubernetes_of(settings)
    body: dict[str, Any] = {
        "spec": {
            "selector": {"matchLabels": selector(settings, track)},
            "strategy": strategy(settings),
            "progressDeadlineSeconds": k.progress_deadline_s,
            "revisionHistoryLimit": settings.rollout.keep_releases,
            "minReadySeconds": settings.health.interval_s,
            "template": pod_template(settings, digest, runtime_yaml, track=track, release_id=release_id),
        }
    }
    if replicas is not None:
        body["spec"]["replicas"] = replicas
    name = app_name(settings) if track == "stable" else canary_name(settings)
    return Manifest(
        "apps/v1",
        "Deployment",
        name,
        k.namespace,
        body,
        labels={**app_labels(settings), K8S_TRACK_LABEL: track},
    )


def service(settings: Settings, pool: PoolSettings) -> Manifest:
    """``pool``'s ClusterIP Service (``settings``: the stack as the pool sees it); where a replica
    spans nodes, in front of its leaders only."""
    k = kubernetes_of(settings)
    port = pool.runtime.port
    body = {
        "spec": {
            "type": "ClusterIP",
            "selector": lw.leader_selector(settings) if lw.replica_spans_nodes(pool) else selector(settings),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        }
    }
    return Manifest("v1", "Service", app_name(settings), k.namespace, body, labels=app_labels(settings))


def ingress(settings: Settings) -> Manifest:
    """The public entry: to the gateway's Service where the stack has one, else to the runtime's."""
    k, health, edge = kubernetes_of(settings), settings.health, settings.edge
    front = gw.GATEWAY_NAME if settings.gateway is not None else app_name(settings)
    labels = gw.gateway_labels() if settings.gateway is not None else app_labels(settings)
    # The ALB checks the pods it forwards to: the gateway answers on its own readiness path.
    ready_path = READINESS_PATH if settings.gateway is not None else health.readiness_path
    annotations: dict[str, str] = {}
    tls: dict[str, Any] = {"hosts": [k.ingress.host]}
    if k.ingress.kind == "alb":
        annotations = {
            # scheme, inbound-cidrs (edge.allow_cidrs) and backend-protocol, as on EC2.
            **ingress_access_annotations(settings),
            "alb.ingress.kubernetes.io/target-type": "ip",
            "alb.ingress.kubernetes.io/listen-ports": json.dumps([{"HTTPS": 443}]),
            "alb.ingress.kubernetes.io/certificate-arn": edge.certificate_arn,
            "alb.ingress.kubernetes.io/ssl-policy": edge.ssl_policy,
            "alb.ingress.kubernetes.io/healthcheck-path": ready_path,
            "alb.ingress.kubernetes.io/healthcheck-interval-seconds": str(health.interval_s),
            "alb.ingress.kubernetes.io/healthcheck-timeout-seconds": str(health.timeout_s),
            "alb.ingress.kubernetes.io/healthy-threshold-count": str(health.healthy_threshold),
            "alb.ingress.kubernetes.io/unhealthy-threshold-count": str(health.unhealthy_threshold),
            "alb.ingress.kubernetes.io/target-group-attributes": (
                f"deregistration_delay.timeout_seconds={settings.rollout.deregistration_delay_s}"
            ),
            "alb.ingress.kubernetes.io/load-balancer-attributes": (
                f"idle_timeout.timeout_seconds={edge.idle_timeout_s}"
            ),
        }
    else:
        tls["secretName"] = k.ingress.tls_secret
    body = {
        "spec": {
            "ingressClassName": k.ingress.class_name,
            "tls": [tls],
            "rules": [
                {
                    "host": k.ingress.host,
                    "http": {
                        "paths": [
                            {
                                # Prefix matches whole path elements: /v1 and below, as the EC2
                                # listener forwards; /metrics and /health/* stay inside the cluster.
                                "path": API_PATH_PREFIX.rstrip("/"),
                                "pathType": "Prefix",
                                "backend": {"service": {"name": front, "port": {"name": "http"}}},
                            }
                        ]
                    },
                }
            ],
        }
    }
    return Manifest(
        "networking.k8s.io/v1", "Ingress", front, k.namespace, body, labels=labels, annotations=annotations
    )


def disruption_budget(settings: Settings) -> Manifest:
    """Voluntary evictions (node drains, upgrades) take at most a rollout batch at once."""
    k = kubernetes_of(settings)
    body = {
        "spec": {
            "maxUnavailable": settings.rollout.batch_size,
            "selector": {"matchLabels": selector(settings, "stable")},
        }
    }
    return Manifest(
        "policy/v1", "PodDisruptionBudget", app_name(settings), k.namespace, body, labels=app_labels(settings)
    )


# --- everything -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolObjects:
    """One model pool's runtime: its release config, Deployment, Service, budget, scaler and
    monitoring, all named ``frontier-<model>`` (the pool's view of the settings); a disaggregated
    pool has two, ``frontier-<model>-prefill`` and ``-decode``, one per half."""

    model: str
    #: The pool's own identity: its pods assume its role alone.
    service_account: Manifest
    config_map: Manifest
    #: The pool's runtime workload: its Deployment, or, where a replica spans several nodes, its
    #: LeaderWorkerSet (``fab deploy`` rolls the former only).
    deployment: Manifest
    service: Manifest
    disruption_budget: Manifest
    scaled_object: Manifest
    service_monitor: Manifest
    #: The stack's SLO alerts: on the first pool only. They select every runtime of the stack
    #: (``job="frontier-runtime"``), whichever pool, so a second copy would only fire twice.
    prometheus_rule: Manifest | None


def pool_objects(
    view: Settings,
    digest: str,
    release_id: str = "",
    *,
    first: bool = True,
    role_arns: Mapping[str, Any] | None = None,
) -> PoolObjects:
    """``view``: the stack as one pool sees it (``Settings.for_pool``), or one half of a
    disaggregated pool (:func:`frontier.targets.kubernetes.disaggregation.role_views`);
    ``role_arns``: each pool's pods' role by model name (IRSA)."""
    pool = view.only_pool
    runtime_yaml = render_runtime_config(view, pd.released_runtime(pool))
    if lw.spans_nodes(view):
        pod = pod_template(view, digest, runtime_yaml, track="stable", release_id=release_id)
        workload = lw.leader_worker_set(view, pod)
    else:
        workload = deployment(view, digest, runtime_yaml, release_id=release_id)
    return PoolObjects(
        model=pool.name,
        service_account=service_account(view, pool, (role_arns or {}).get(pool.name)),
        config_map=config_map(view, runtime_yaml),
        deployment=workload,
        service=service(view, pool),
        disruption_budget=disruption_budget(view),
        scaled_object=scaled_object(view),
        service_monitor=service_monitor(view),
        prometheus_rule=prometheus_rule(view) if first else None,
    )


@dataclass(frozen=True)
class GatewayObjects:
    service_account: Manifest
    # Its Role (EndpointSlices, listed) and the binding to its service account.
    discovery_access: tuple[Manifest, Manifest]
    config_map: Manifest
    deployment: Manifest
    service: Manifest
    disruption_budget: Manifest
    service_monitor: Manifest


def gateway_objects(settings: Settings, role_arn: Any = None) -> GatewayObjects:
    text = gw.gateway_yaml(settings)
    return GatewayObjects(
        service_account=gw.service_account(settings, role_arn),
        discovery_access=gw.discovery_access(settings),
        config_map=gw.config_map(settings, text),
        deployment=gw.deployment(settings, text),
        service=gw.service(settings),
        disruption_budget=gw.disruption_budget(settings),
        service_monitor=gw.service_monitor(settings),
    )


@dataclass(frozen=True)
class Workload:
    """Every object of one stack: shared ones, each model pool's, and the gateway's where it has one."""

    namespace: Manifest
    network_policies: tuple[Manifest, ...]
    pools: tuple[PoolObjects, ...]
    ingress: Manifest
    gateway: GatewayObjects | None = None
    # What fab may do in the namespace: a Role and its binding to the deploy role's group.
    deploy_access: tuple[Manifest, ...] = ()
    # The synthetic probe: its NetworkPolicy and a CronJob per pool.
    probe: tuple[Manifest, ...] = ()

    @property
    def deployment(self) -> Manifest:
        """The first pool's workload, whose name the Pulumi program's workloads component exports."""
        return self.pools[0].deployment

    @property
    def runtime_deployments(self) -> list[Manifest]:
        """The pools' Deployments, which ``fab deploy`` rolls; Pulumi leaves their template and replicas alone."""
        return [pool.deployment for pool in self.pools if pool.deployment.kind == "Deployment"]

    @property
    def leader_worker_sets(self) -> list[Manifest]:
        """The pools whose replicas span nodes: ``fab deploy`` rolls their templates, KEDA their replicas."""
        return [pool.deployment for pool in self.pools if pool.deployment.kind == lw.KIND]

    def all(self) -> list[Manifest]:
        """In apply order: what an object names exists before it (config before Deployment, Service
        before Ingress, CRD objects last)."""
        g = self.gateway
        return [
            self.namespace,
            *self.deploy_access,
            # A disaggregated pool's halves run as the pool's one identity.
            *{p.service_account.name: p.service_account for p in self.pools}.values(),
            *([g.service_account, *g.discovery_access] if g else []),
            *self.network_policies,
            *(m for p in self.pools for m in (p.config_map, p.deployment, p.service, p.disruption_budget)),
            *([g.config_map, g.deployment, g.service, g.disruption_budget] if g else []),
            self.ingress,
            *self.probe,
            *(m for p in self.pools for m in (p.scaled_object, p.service_monitor)),
            # The stack's SLO alerts, which one pool carries.
            *(p.prometheus_rule for p in self.pools if p.prometheus_rule is not None),
            *([g.service_monitor] if g else []),
        ]


def render_workload(
    settings: Settings,
    digest: str,
    *,
    role_arns: Mapping[str, Any] | None = None,
    release_id: str = "",
    gateway_role_arn: Any = None,
) -> Workload:
    """The stack's objects for the runtime image ``digest`` (checked: tags are refused), every
    pool on it: a new pool's first release is the stack's image, then ``fab deploy --model``."""
    return Workload(
        namespace=namespace(settings),
        network_policies=tuple(network_policies(settings)),
        pools=tuple(
            pool_objects(view, digest, release_id, first=i == 0, role_arns=role_arns)
            for i, view in enumerate(gw.workload_views(settings))
        ),
        ingress=ingress(settings),
        gateway=gateway_objects(settings, gateway_role_arn) if settings.gateway is not None else None,
        deploy_access=deploy_role(settings),
        probe=probe_objects(settings, digest),
    )


def probe_objects(settings: Settings, digest: str) -> tuple[Manifest, ...]:
    """Each pool's probe runs the runtime's image as the pool's service account, whose role reads
    that pool's own key set: the key it presents."""
    return (
        probe_network_policy(settings),
        *(
            probe_cron_job(
                settings,
                pool,
                image_reference(pool, digest),
                pool_service_account(settings, pool),
                pool.runtime.api_keys_secret or "",
            )
            for pool in settings.pools
        ),
    )


def yaml_files(manifests: Sequence[Manifest], folder: str = "kubernetes") -> dict[str, str]:
    """One YAML file per object, numbered in apply order, for ``kubectl apply -f`` or GitOps."""
    files = {}
    for i, manifest in enumerate(manifests, start=1):
        name = f"{folder}/{i:02d}-{manifest.kind.lower()}-{manifest.name}.yaml"
        files[name] = yaml.safe_dump(manifest.to_dict(), sort_keys=False)
    return files


def manifest_files(settings: Settings, digest: str) -> dict[str, str]:
    """What ``fab render`` adds for a Kubernetes stack (nothing for others).

    Without a real digest the stack's ``kubernetes.image`` pins the image, where it names one.
    """
    k = settings.kubernetes
    if k is None:
        return {}
    if is_placeholder(digest) and k.image:
        digest = k.image.partition("@")[2]
    # The Prometheus stack's part (GPU exporter, resource alerts, routes, dashboard) apart: other
    # namespaces, and applied where that stack runs.
    return {
        **yaml_files(render_workload(settings, digest).all()),
        **yaml_files(monitoring_objects(settings), folder="kubernetes/monitoring"),
        # The pods' log shipper: a namespace of its own, applied beside the workload.
        **yaml_files(logging_objects(settings), folder="kubernetes/logging"),
    }
