"""A disaggregated pool on Kubernetes: two Deployments, prefill and decode, and the rules that let
only the pair talk on the transfer port.

A pool with ``disaggregation: {prefill, decode}`` renders each half as a pool of its own
(:func:`role_pool`): the pool on that half's node group, with that half's replicas and the
runtime its group runs (``PoolSettings.runtime_on``), so every object of the half is named
``frontier-<model>-<role>`` (:func:`frontier.targets.kubernetes.objects.app_name`) and selects
that half's pods only: Deployment, Service, ConfigMap, disruption budget, ScaledObject,
ServiceMonitor. Choices worth knowing:

- **One config for the pair.** Both halves mount the release's ``runtime.yaml`` as ``fab
  deploy`` builds it for the pool (``kv_transfer.role: both``); the pod's command adds its half's
  ``--kv-role`` (the Deployment says which, as its node pool says where), so a release is one set
  of bytes for the pair and a rollback brings both back to one layout. A prefill pod also adds
  ``--kv-host $(POD_IP)``: its transfer listener binds the pod's address and answers it as
  ``remote_host``; a pod's name, the default, resolves nowhere in the cluster.
- **The gateway** lists the pool's prefill Service and decode Service as the two hops, and the
  decode Service as its colocated fallback: a decode replica computes a prompt itself when no
  prefill is ready (as after a failed prefill hop), and the gateway's hold for a pool at zero waits
  on it. Each Service spreads over its ready pods; the prefill's answer names the very pod that
  holds the blocks, by address.
- **Network**: the prefill pods take the transfer port from the decode pods alone, and the decode
  pods may reach the prefill pods on it and nothing else beyond a runtime's usual egress; both take
  the serving port from the gateway (:func:`kv_transfer_policies`).
- **Scaling**: each half its own ScaledObject, on its own signal
  (:mod:`frontier.targets.kubernetes.autoscaling`): prompts waiting for a prefill, running streams
  for a decode; each half's ``replicas`` is its floor while it serves.
- **Rollout**: prefill first, then decode (:mod:`frontier.targets.kubernetes.pair_rollout`).
"""

from __future__ import annotations

from typing import Any

from frontier.config.schema import PoolSettings, Settings
from frontier.targets.kubernetes.objects import (
    Manifest,
    kubernetes_of,
    kv_role,
    pool_policy,
    selector,
)

HALVES = ("prefill", "decode")
# The prefill container's named port for the KV transfer listener.
KV_PORT_NAME = "kv-transfer"
POD_IP_ENV = "POD_IP"


def role_pool(pool: PoolSettings, half: str) -> PoolSettings:
    """One half of the disaggregated ``pool``, as its workload runs it: on that half's node group,
    with its replicas and the runtime its group runs."""
    assert pool.disaggregation is not None and half in HALVES
    role = getattr(pool.disaggregation, half)
    return pool.model_copy(
        update={
            "group": role.group,
            "replicas": role.replicas,
            "runtime": pool.runtime_on(role.group),
            "disaggregation": None,
        }
    )


def role_pools(pool: PoolSettings) -> list[PoolSettings]:
    """The pools ``pool``'s runtime workloads are rendered for: itself, or its prefill half and its
    decode half, in rollout order."""
    if pool.disaggregation is None:
        return [pool]
    return [role_pool(pool, half) for half in HALVES]


def released_runtime(pool: PoolSettings) -> PoolSettings:
    """``pool`` (or a half of it) with the runtime the pool's release renders
    (``kv_transfer.role: both``): the ``runtime.yaml`` both halves mount."""
    if kv_role(pool) is None:
        return pool
    kv_transfer = pool.runtime.kv_transfer.model_copy(update={"role": "both"})
    return pool.model_copy(update={"runtime": pool.runtime.model_copy(update={"kv_transfer": kv_transfer})})


def role_arguments(pool: PoolSettings) -> list[str]:
    """What a half's runtime command adds: its role, and a prefill's address (see the module)."""
    role = kv_role(pool)
    if role is None:
        return []
    if role == "prefill":
        # Kubernetes expands $(VAR) in a command from the container's env.
        return ["--kv-role", role, "--kv-host", f"$({POD_IP_ENV})"]
    return ["--kv-role", role]


def role_env(pool: PoolSettings) -> list[dict[str, Any]]:
    """A prefill pod's own address, from the downward API."""
    if kv_role(pool) != "prefill":
        return []
    return [{"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def role_ports(pool: PoolSettings) -> list[dict[str, Any]]:
    """A prefill container's transfer listener."""
    if kv_role(pool) != "prefill":
        return []
    return [{"name": KV_PORT_NAME, "containerPort": pool.runtime.kv_transfer.port, "protocol": "TCP"}]


def kv_transfer_policies(settings: Settings, pool: PoolSettings) -> list[Manifest]:
    """The pair's transfer port: into the prefill pods from the decode pods only, and out of the
    decode pods to the prefill pods only (a decode pulls; a prefill never connects back)."""
    if pool.disaggregation is None:
        return []
    prefill, decode = (role_pool(pool, half) for half in HALVES)
    namespace = kubernetes_of(settings).namespace
    port = [{"protocol": "TCP", "port": pool.runtime.kv_transfer.port}]
    decode_pods = [{"podSelector": {"matchLabels": selector(decode)}}]
    prefill_pods = [{"podSelector": {"matchLabels": selector(prefill)}}]
    return [
        pool_policy(prefill, "kv-transfer", namespace, ingress=[{"from": decode_pods, "ports": port}]),
        pool_policy(decode, "kv-transfer", namespace, egress=[{"to": prefill_pods, "ports": port}]),
    ]
