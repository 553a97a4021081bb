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
  Service, disruption budget, ScaledObject and ServiceMonitor, each rendered for the pool it is
  handed and so named ``frontier-<model>``. A pool's ``node_group`` names a ``node_groups`` entry
  (its GPUs, sizes, schedule, scale to zero); the pool's pods run on the ``kubernetes.node_pools``
  entry whose ``node_group`` is that one (its labels select the nodes, its taints are tolerated).
  A node group's sizes stay the one truth of capacity, so a node pool never repeats them; two
  model pools may share a node group (and so a node pool). The stack's SLO alerts come once (they
  select every runtime of the stack).
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
    K8S_VERIFIED_CONDITION,
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


def strategy(settings: Settings, pool: PoolSettings) -> dict[str, Any]:
    """Surge first where ``pool``'s node pool can grow (no replica lost), else batch_size out at once."""
    rollout, group = settings.rollout, pool.group
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


def config_map(settings: Settings, pool: PoolSettings, runtime_yaml: str) -> Manifest:
    """``pool``'s release config, named by its content."""
    k = kubernetes_of(settings)
    return Manifest(
        "v1",
        "ConfigMap",
        config_map_name(pool, runtime_yaml),
        k.namespace,
        {"immutable": True, "data": {CONFIG_FILE: runtime_yaml}},
        labels=app_labels(pool),
        annotations={K8S_CONFIG_HASH_ANNOTATION: f"sha256:{config_hash(runtime_yaml)}"},
    )


def _tolerations(node_pool: NodePool) -> list[dict[str, Any]]:
    out = []
    for taint in node_pool.taints:
        toleration: dict[str, Any] = {"key": taint.key, "effect": taint.effect}
        if taint.value:
            toleration.update(operator="Equal", value=taint.value)
        else:
            toleration["operator"] = "Exists"
        out.append(toleration)
    return out


def pod_template(
    settings: Settings,
    pool: PoolSettings,
    digest: str,
    runtime_yaml: str,
    *,
    track: str,
    release_id: str = "",
) -> dict[str, Any]:
    """The pod of ``pool``'s runtime workload (a half's, for a half of a disaggregated pool)."""
    k, health = kubernetes_of(settings), settings.health
    rt = pool.runtime
    node_pool = serving_pool(settings, pool)
    gpu = pool.group.accelerator == "gpu"
    # Requests equal to limits: the pod is Guaranteed, never the first evicted under node pressure.
    # (Extended resources such as GPUs cannot be overcommitted anyway: their requests must equal limits.)
    amounts = cpu_and_memory(settings, pool)
    if gpu:
        amounts[GPU_RESOURCE] = str(gpus_per_pod(pool))
    resources: dict[str, Any] = {"requests": dict(amounts), "limits": dict(amounts)}
    annotations = {
        K8S_CONFIG_HASH_ANNOTATION: f"sha256:{config_hash(runtime_yaml)}",
        "kubectl.kubernetes.io/default-container": CONTAINER_NAME,
    }
    if release_id:
        annotations[K8S_RELEASE_ANNOTATION] = release_id
    container = {
        "name": CONTAINER_NAME,
        "image": image_reference(pool, digest),  # the digest is checked there: tags are refused
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "python",
            "-m",
            "frontier_runtime",
            "serve",
            "--config",
            f"{CONTAINER_RELEASE_DIR}/{CONFIG_FILE}",
            *pd.role_arguments(pool),
        ],
        "ports": [{"name": "http", "containerPort": rt.port, "protocol": "TCP"}, *pd.role_ports(pool)],
        "env": [
            *pd.role_env(pool),
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
        "serviceAccountName": pool_service_account(settings, pool),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace_period_s(settings, pool),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": k.run_as_user,
            "runAsGroup": k.run_as_user,
            "fsGroup": k.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "nodeSelector": dict(node_pool.labels),
        "tolerations": _tolerations(node_pool),
        "affinity": {
            # One replica per node: a node's GPUs belong to one replica, and a node lost takes one.
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": selector(pool)},
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
                    "name": config_map_name(pool, runtime_yaml),
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
        "metadata": {"labels": {**app_labels(pool), K8S_TRACK_LABEL: track}, "annotations": annotations},
        "spec": spec,
    }
    shape = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]
    annotations[TEMPLATE_HASH_ANNOTATION] = shape
    return template


def deployment(
    settings: Settings,
    pool: PoolSettings,
    digest: str,
    runtime_yaml: str,
    *,
    track: str = "stable",
    replicas: int | None = None,
    release_id: str = "",
    held_until_verified: bool = False,
) -> Manifest:
    """``pool``'s runtime Deployment; ``replicas`` None leaves the count to the autoscaler.

    ``held_until_verified`` (a canary under ``rollout.verify_canary``): each pod carries the
    readiness gate :data:`K8S_VERIFIED_CONDITION`, so it is not Ready, and not among its Service's
    endpoints, until the rollout has verified it and set that condition. The gate sits outside the
    template's shape hash: it says how the pod joins, not what it runs.
    """
    if track not in TRACKS:
        raise FrontierError(f"track {track!r}: expected one of {', '.join(TRACKS)}")
    k = kubernetes_of(settings)
    template = pod_template(settings, pool, digest, runtime_yaml, track=track, release_id=release_id)
    if held_until_verified:
        template["spec"]["readinessGates"] = [{"conditionType": K8S_VERIFIED_CONDITION}]
    body: dict[str, Any] = {
        "spec": {
            "selector": {"matchLabels": selector(pool, track)},
            "strategy": strategy(settings, pool),
            "progressDeadlineSeconds": k.progress_deadline_s,
            "revisionHistoryLimit": settings.rollout.keep_releases,
            "minReadySeconds": settings.health.interval_s,
            "template": template,
        }
    }
    if replicas is not None:
        body["spec"]["replicas"] = replicas
    name = app_name(pool) if track == "stable" else canary_name(pool)
    return Manifest(
        "apps/v1",
        "Deployment",
        name,
        k.namespace,
        body,
        labels={**app_labels(pool), K8S_TRACK_LABEL: track},
    )


def service(settings: Settings, pool: PoolSettings) -> Manifest:
    """``pool``'s ClusterIP Service; where a replica spans nodes, in front of its leaders only."""
    k = kubernetes_of(settings)
    port = pool.runtime.port
    body = {
        "spec": {
            "type": "ClusterIP",
            "selector": lw.leader_selector(pool) if lw.replica_spans_nodes(pool) else selector(pool),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        }
    }
    return Manifest("v1", "Service", app_name(pool), k.namespace, body, labels=app_labels(pool))


def ingress(settings: Settings, front: Manifest) -> Manifest:
    """The public entry, forwarding to ``front``: the gateway's Service where the stack has one,
    else its runtime's (:func:`render_workload` says which). Named and labelled as ``front``."""
    k, health, edge = kubernetes_of(settings), settings.health, settings.edge
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
                                "backend": {"service": {"name": front.name, "port": {"name": "http"}}},
                            }
                        ]
                    },
                }
            ],
        }
    }
    return Manifest(
        "networking.k8s.io/v1",
        "Ingress",
        front.name,
        k.namespace,
        body,
        labels=dict(front.labels),
        annotations=annotations,
    )


def disruption_budget(settings: Settings, pool: PoolSettings) -> Manifest:
    """Voluntary evictions (node drains, upgrades) take at most a rollout batch of ``pool``'s pods at once."""
    k = kubernetes_of(settings)
    body = {
        "spec": {
            "maxUnavailable": settings.rollout.batch_size,
            "selector": {"matchLabels": selector(pool, "stable")},
        }
    }
    return Manifest(
        "policy/v1", "PodDisruptionBudget", app_name(pool), k.namespace, body, labels=app_labels(pool)
    )


# --- everything -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolObjects:
    """One model pool's runtime: its release config, Deployment, Service, budget, scaler and
    monitoring, all named ``frontier-<model>`` (:func:`frontier.targets.kubernetes.objects.app_name`);
    a disaggregated pool has two, ``frontier-<model>-prefill`` and ``-decode``, one per half."""

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
    settings: Settings,
    pool: PoolSettings,
    digest: str,
    release_id: str = "",
    *,
    first: bool = True,
    role_arns: Mapping[str, Any] | None = None,
) -> PoolObjects:
    """The objects of ``pool``, a model pool or one half of a disaggregated pool
    (:func:`frontier.targets.kubernetes.disaggregation.role_pools`); ``role_arns``: each pool's pods'
    role by model name (IRSA). The stack's alerting rules come with its ``first`` pool."""
    runtime_yaml = render_runtime_config(settings, pd.released_runtime(pool))
    if lw.replica_spans_nodes(pool):
        pod = pod_template(settings, pool, digest, runtime_yaml, track="stable", release_id=release_id)
        workload = lw.leader_worker_set(settings, pool, pod)
    else:
        workload = deployment(settings, pool, digest, runtime_yaml, release_id=release_id)
    return PoolObjects(
        model=pool.name,
        service_account=service_account(settings, pool, (role_arns or {}).get(pool.name)),
        config_map=config_map(settings, pool, runtime_yaml),
        deployment=workload,
        service=service(settings, pool),
        disruption_budget=disruption_budget(settings, pool),
        scaled_object=scaled_object(settings, pool),
        service_monitor=service_monitor(settings, pool),
        prometheus_rule=prometheus_rule(settings, pool) if first else None,
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
    def workloads(self) -> list[Manifest]:
        """Each pool's runtime workload (its Deployment or LeaderWorkerSet), in the pools' order."""
        return [pool.deployment for pool in self.pools]

    @property
    def deployment(self) -> Manifest:
        """The first pool's workload, whose name the Pulumi program's workloads component exports."""
        return self.workloads[0]

    @property
    def runtime_deployments(self) -> list[Manifest]:
        """The pools' Deployments, which ``fab deploy`` rolls; Pulumi leaves their template and replicas alone."""
        return [workload for workload in self.workloads if workload.kind == "Deployment"]

    @property
    def leader_worker_sets(self) -> list[Manifest]:
        """The pools whose replicas span nodes: ``fab deploy`` rolls their templates, KEDA their replicas."""
        return [workload for workload in self.workloads if workload.kind == lw.KIND]

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
    pools = tuple(
        pool_objects(settings, pool, digest, release_id, first=i == 0, role_arns=role_arns)
        for i, pool in enumerate(gw.workload_pools(settings))
    )
    gateway = gateway_objects(settings, gateway_role_arn) if settings.gateway is not None else None
    return Workload(
        namespace=namespace(settings),
        network_policies=tuple(network_policies(settings)),
        pools=pools,
        ingress=ingress(settings, _front(pools, gateway)),
        gateway=gateway,
        deploy_access=deploy_role(settings),
        probe=probe_objects(settings, digest),
    )


def _front(pools: Sequence[PoolObjects], gateway: GatewayObjects | None) -> Manifest:
    """The Service the Ingress forwards to: the gateway's, else the runtime's of a stack without a
    gateway, which serves one model (the stack checks give several models a gateway)."""
    if gateway is not None:
        return gateway.service
    (runtime,) = pools
    return runtime.service


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
