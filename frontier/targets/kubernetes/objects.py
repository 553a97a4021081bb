"""What every Kubernetes object of a stack shares: the :class:`Manifest` shape, names and labels.

The renderers (:mod:`frontier.targets.kubernetes.manifests`, ``.autoscaling``, ``.network_policies``), the
Pulumi program and the rollout all name and select the runtime's objects through these functions.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from frontier_hostside.names import (
    CONTAINER_NAME,
    K8S_APP_LABEL,
    K8S_INSTANCE_LABEL,
    K8S_MANAGED_BY_LABEL,
    K8S_TRACK_LABEL,
)
from frontier_runtime.config import KvRole

from frontier.config.schema import Kubernetes, PoolSettings, Settings

CONFIG_FILE = "runtime.yaml"
# On a disaggregated pool's objects and pods: the half they run (kubectl get pods -l ...=prefill).
KV_ROLE_LABEL = "frontier.dev/kv-role"
# On the pod template: a hash of the template itself, so a deploy of the release that runs still
# rolls when the stack changed the pod's shape (probes, volumes, placement) but not the release.
TEMPLATE_HASH_ANNOTATION = "frontier.dev/pod-template-hash"
# A container of ours (the runtime's, the gateway's): no privileges, nothing written outside its
# volumes. Copied into each pod spec, so a spec edited later never changes another's.
RESTRICTED_CONTAINER: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}


@dataclass(frozen=True)
class Manifest:
    """One Kubernetes object: its identity plus everything under it but ``metadata``."""

    api_version: str
    kind: str
    name: str
    namespace: str | None
    body: Mapping[str, Any]
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, Any] = field(default_factory=dict)

    @property
    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name}
        if self.namespace:
            meta["namespace"] = self.namespace
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        return meta

    def to_dict(self) -> dict[str, Any]:
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": self.metadata, **self.body}


def kubernetes_of(settings: Settings) -> Kubernetes:
    """The stack's Kubernetes section (a StackError naming the stack's target elsewhere)."""
    return settings.section(Kubernetes)


# --- names and labels -----------------------------------------------------------------------------


def kv_role(pool: PoolSettings) -> KvRole | None:
    """The half of a disaggregated pool that ``pool`` is (``prefill``, ``decode``; see
    :mod:`frontier.targets.kubernetes.disaggregation`), None for a colocated pool."""
    role = pool.runtime.kv_transfer.role
    return None if role == "both" else role


# A runtime workload is named and selected by its pool: a model pool, or a half of a disaggregated
# pool as :func:`frontier.targets.kubernetes.disaggregation.role_pools` narrows it.


def _instance(pool: PoolSettings) -> tuple[str, str | None]:
    """The name of ``pool``'s workload, and its half where it is one."""
    return _instance_of(pool, kv_role(pool))


def _instance_of(pool: PoolSettings, role: str | None) -> tuple[str, str | None]:
    slug = re.sub(r"[^a-z0-9]+", "-", pool.model.name.lower()).strip("-")
    if role is None:
        return f"frontier-{slug}"[:48].rstrip("-"), None
    return f"{f'frontier-{slug}'[: 47 - len(role)].rstrip('-')}-{role}", role


def app_name(pool: PoolSettings, half: str | None = None) -> str:
    """``frontier-<model>``: a DNS-1035 label (Service names allow no dots), one per model;
    ``frontier-<model>-<role>`` for each half of a disaggregated pool (``pool`` narrowed to it, or
    named by ``half``)."""
    return _instance_of(pool, half or kv_role(pool))[0]


def canary_name(pool: PoolSettings) -> str:
    return f"{app_name(pool)}-canary"


def config_map_name(pool: PoolSettings, runtime_yaml: str) -> str:
    return f"{app_name(pool)}-config-{config_hash(runtime_yaml)[:10]}"


def config_hash(runtime_yaml: str) -> str:
    return hashlib.sha256(runtime_yaml.encode()).hexdigest()


def app_labels(pool: PoolSettings) -> dict[str, str]:
    """What every object of ``pool``'s workload carries and what its Service selects (both tracks);
    a disaggregated pool's half also says its role."""
    name, role = _instance(pool)
    labels = {K8S_APP_LABEL: CONTAINER_NAME, K8S_INSTANCE_LABEL: name, K8S_MANAGED_BY_LABEL: "frontier"}
    if role is not None:
        labels[KV_ROLE_LABEL] = role
    return labels


def stack_labels() -> dict[str, str]:
    """What the stack's own objects carry (its namespace, its runtimes' identity): every pool's."""
    return {K8S_APP_LABEL: CONTAINER_NAME, K8S_MANAGED_BY_LABEL: "frontier"}


def selector(pool: PoolSettings, track: str | None = None) -> dict[str, str]:
    """The pods of ``pool``'s workload: of ``track`` (stable, canary), or of both."""
    labels = {K8S_APP_LABEL: CONTAINER_NAME, K8S_INSTANCE_LABEL: app_name(pool)}
    if track:
        labels[K8S_TRACK_LABEL] = track
    return labels


def pool_policy(
    pool: PoolSettings,
    suffix: str,
    namespace: str,
    *,
    ingress: list[dict[str, Any]] | None = None,
    egress: list[dict[str, Any]] | None = None,
) -> Manifest:
    """The NetworkPolicy ``<app>-<suffix>`` over ``pool``'s pods (both tracks): the ``ingress`` and
    ``egress`` rules given, each of the two a policy type where it is given."""
    types: list[str] = []
    spec: dict[str, Any] = {"podSelector": {"matchLabels": selector(pool)}, "policyTypes": types}
    if ingress is not None:
        types.append("Ingress")
        spec["ingress"] = ingress
    if egress is not None:
        types.append("Egress")
        spec["egress"] = egress
    return Manifest(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        f"{app_name(pool)}-{suffix}",
        namespace,
        {"spec": spec},
        labels=app_labels(pool),
    )


def http_probe(settings: Settings, path: str, failure_threshold: int, success_threshold: int = 1) -> dict:
    """A probe of ``path`` on the container's ``http`` port, at the stack's health interval and timeout."""
    health = settings.health
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": health.interval_s,
        "timeoutSeconds": health.timeout_s,
        "failureThreshold": failure_threshold,
        "successThreshold": success_threshold,
    }
