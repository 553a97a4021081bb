"""A replica over several nodes: a LeaderWorkerSet (sigs.k8s.io/lws) instead of a Deployment.

A pool whose ``runtime.nodes_per_replica`` N is above 1 runs each replica as a group of N pods,
one per node: the leader (node 0) runs ``serve`` exactly as a one-node replica's pod does (API,
probes, preStop, the same image and weights volume) and the N - 1 workers run ``python -m
frontier_runtime node``, whose ranks join the leader's. A group is one replica: the LWS's
``replicas`` count groups, and KEDA scales it through its scale subresource.

Choices worth knowing:

- **RecreateGroupOnPodRestart.** A replica cannot serve with a node missing: the runtime's leader
  stops (readiness and liveness fail, exit 3) as soon as one of its nodes is lost. With this
  restart policy the LWS controller also deletes and recreates every pod of the group when any of
  its pods is recreated or restarts, so the group comes back whole, all nodes starting together,
  instead of a lone worker rejoining a leader that has already given up.
- **LeaderCreated.** The workers start as soon as the leader pod exists, not once it is ready: the
  leader becomes ready only after every node has joined, so waiting for its readiness would wait
  forever.
- **Leaders only behind the Service.** LWS labels the leader pod with worker index 0; the pool's
  Service (and so the gateway, the ALB and the ServiceMonitor) selects those alone. Workers serve
  no HTTP and have no probes: a worker exits when its leader or one of its ranks dies, and its
  restart recreates the group.
- **The replica key** (the HMAC key of the leader's step channel) comes from a Kubernetes Secret by
  ``secretKeyRef``, one per pool, whose value Pulumi makes (:mod:`infra.workloads`); no rendered
  file holds it. A GitOps flow applying ``fab render``'s files creates that Secret itself.
- **Rollout**: LWS's own rolling update, group by group, surging ``rollout.max_surge`` groups and
  keeping every serving group up (maxUnavailable 0) where the node group can grow. ``fab deploy``
  patches both templates and gates the new leaders
  (:mod:`frontier.targets.kubernetes.group_rollout`).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from frontier_hostside.names import (
    CONTAINER_NAME,
    K8S_TRACK_LABEL,
    LEADER_ADDRESS_ENV,
    NODE_COMMAND,
    NODE_RANK_ENV,
    REPLICA_KEY_ENV,
    REPLICA_STEP_PORT,
    REPLICA_STORE_PORT,
)

from frontier.config.schema import PoolSettings, Settings
from frontier.targets.kubernetes.objects import (
    TEMPLATE_HASH_ANNOTATION,
    Manifest,
    app_labels,
    app_name,
    kubernetes_of,
    selector,
)

API_VERSION = "leaderworkerset.x-k8s.io/v1"
KIND = "LeaderWorkerSet"
PLURAL = "leaderworkersets"
# What the LWS controller puts on every pod of a group: the pod's index in it (0: the leader).
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# What its pod webhook puts first in every container's env, so later entries may expand them.
LWS_WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
LWS_LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
# The key inside the pool's replica-key Secret.
REPLICA_KEY_FIELD = "key"
# The LWS controller names a headless Service after the LWS (its pods' DNS subdomain), so the LWS
# cannot take the pool's name: that is the pool's own Service's.
NAME_SUFFIX = "-group"


def replica_spans_nodes(pool: PoolSettings) -> bool:
    """Whether a replica of ``pool`` spans several nodes (a LeaderWorkerSet runs it)."""
    return pool.runtime.nodes_per_replica > 1


def set_name(pool: PoolSettings) -> str:
    """The name of the LeaderWorkerSet of ``pool``'s pool."""
    return f"{app_name(pool)}{NAME_SUFFIX}"


def replica_key_secret(pool: PoolSettings) -> str:
    """The Secret that holds the pool's replica key (made by Pulumi, never rendered)."""
    return f"{app_name(pool)}-replica-key"


def leader_selector(pool: PoolSettings) -> dict[str, str]:
    """The pool's leader pods: what its Service selects."""
    return {**selector(pool), WORKER_INDEX_LABEL: "0"}


def _restamp(template: dict[str, Any]) -> dict[str, Any]:
    """The pod template's shape hash, over the template as it now is (see TEMPLATE_HASH_ANNOTATION)."""
    annotations = template["metadata"]["annotations"]
    annotations.pop(TEMPLATE_HASH_ANNOTATION, None)
    shape = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]
    annotations[TEMPLATE_HASH_ANNOTATION] = shape
    return template


def _replica_key_env(pool: PoolSettings) -> dict[str, Any]:
    return {
        "name": REPLICA_KEY_ENV,
        "valueFrom": {"secretKeyRef": {"name": replica_key_secret(pool), "key": REPLICA_KEY_FIELD}},
    }


def leader_template(runtime_pod: dict[str, Any], pool: PoolSettings) -> dict[str, Any]:
    """A one-node replica's pod (``runtime_pod``), as node 0 of the group: rank 0 and the replica key,
    and the ports the other nodes' ranks reach it on."""
    template = copy.deepcopy(runtime_pod)
    container = _runtime_container(template)
    container["env"] += [{"name": NODE_RANK_ENV, "value": "0"}, _replica_key_env(pool)]
    container["ports"] += [
        {"name": "replica-step", "containerPort": REPLICA_STEP_PORT, "protocol": "TCP"},
        {"name": "replica-store", "containerPort": REPLICA_STORE_PORT, "protocol": "TCP"},
    ]
    return _restamp(template)


def worker_template(runtime_pod: dict[str, Any], pool: PoolSettings) -> dict[str, Any]:
    """Node k >= 1: ``frontier_runtime node`` in the same image, volumes, resources and placement,
    told its rank and its leader by what LWS injects. No port, probe or preStop: it serves no HTTP
    and takes no traffic; it exits when broken, and the group is recreated."""
    template = copy.deepcopy(runtime_pod)
    container = _runtime_container(template)
    serve = container["command"]
    container["command"] = [*serve[:3], NODE_COMMAND, *serve[4:]]
    for field in ("ports", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle"):
        container.pop(field, None)
    container["env"] += [
        # LWS puts its variables before the container's own, so these expand them.
        {"name": NODE_RANK_ENV, "value": f"$({LWS_WORKER_INDEX_ENV})"},
        {"name": LEADER_ADDRESS_ENV, "value": f"$({LWS_LEADER_ADDRESS_ENV})"},
        _replica_key_env(pool),
    ]
    return _restamp(template)


def _runtime_container(template: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in template["spec"]["containers"] if c["name"] == CONTAINER_NAME)


def rollout_strategy(settings: Settings, pool: PoolSettings) -> dict[str, Any]:
    """Surge whole groups where ``pool``'s node group can grow (no replica lost), else batch_size
    groups out.

    LWS refuses maxUnavailable 0 with maxSurge 0: a node group at its largest size rolls
    ``rollout.batch_size`` groups at a time.
    """
    rollout, group = settings.rollout, pool.group
    nodes = pool.runtime.nodes_per_replica
    can_grow = rollout.max_surge > 0 and group.max_size - group.desired_size >= nodes
    return {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {
            "maxSurge": rollout.max_surge if can_grow else 0,
            "maxUnavailable": 0 if can_grow else rollout.batch_size,
        },
    }


def leader_worker_set(
    settings: Settings, pool: PoolSettings, runtime_pod: dict[str, Any], *, replicas: int | None = None
) -> Manifest:
    """``pool``'s LeaderWorkerSet: groups of ``runtime.nodes_per_replica`` pods built from
    ``runtime_pod`` (a one-node replica's pod template); ``replicas`` None leaves the count to KEDA."""
    k = kubernetes_of(settings)
    spec: dict[str, Any] = {
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": rollout_strategy(settings, pool),
        "leaderWorkerTemplate": {
            "size": pool.runtime.nodes_per_replica,
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": leader_template(runtime_pod, pool),
            "workerTemplate": worker_template(runtime_pod, pool),
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return Manifest(
        API_VERSION,
        KIND,
        set_name(pool),
        k.namespace,
        {"spec": spec},
        labels={**app_labels(pool), K8S_TRACK_LABEL: "stable"},
    )
