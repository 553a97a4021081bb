"""Kubernetes: the runtime is a Deployment; Kubernetes places, drains and rolls its pods.

``fab deploy`` and ``fab rollback`` keep their meaning: the release goes through a canary
Deployment and the metric gate, then the Deployment rolls it with the stack's surge settings (see
:mod:`frontier.targets.kubernetes.rollout`). History, releases and the deploy lock live in the same S3
bucket and format as on EC2 (the ``history_bucket`` / ``history_prefix`` stack outputs, read as
:class:`frontier.config.outputs.KubernetesOutputs`).

The cluster is reached with the official ``kubernetes`` client from a kubeconfig: the stack's own
(``kubernetes.cluster.kubeconfig`` / ``context``) for an existing cluster; for one the stack
created, ``$KUBECONFIG`` (else ``~/.kube/config``) with the context named like the cluster, as
``aws eks update-kubeconfig --name <cluster> --alias <cluster>`` writes it.

A disaggregated pool runs as two Deployments, prefill and decode: ``fab deploy`` and ``fab
rollback`` roll both, prefill first (:mod:`frontier.targets.kubernetes.pair_rollout`).

A stack with ``rollout.traffic_steps`` rolls a pool's Deployment by traffic share, its canary
Deployment growing as the stable one shrinks (:mod:`frontier.targets.kubernetes.weighted`).

A pool whose replica spans several nodes runs as a LeaderWorkerSet, not a Deployment: ``fab deploy``
and ``fab rollback`` roll it through :mod:`frontier.targets.kubernetes.group_rollout` (both pod
templates patched, the LWS controller rolling group by group, the same gate, no canary).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from frontier_settings import FieldProblem
from kubernetes import config as kube_config
from kubernetes.client import ApiClient

from frontier import aws
from frontier.config.outputs import KubernetesOutputs
from frontier.config.schema import Kubernetes, PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.hosts.inventory import HostSpec
from frontier.release.release import Release
from frontier.rollout.aws_target import AwsTarget
from frontier.rollout.canary import CanaryVerification, canary_verification
from frontier.rollout.rolling import Reporter, RolloutResult
from frontier.targets.kubernetes import disaggregation as pd
from frontier.targets.kubernetes import leader_workers as lw
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes import rules
from frontier.targets.kubernetes.group_rollout import LeaderWorkerSetRollout
from frontier.targets.kubernetes.pair_rollout import PairRollout
from frontier.targets.kubernetes.rollout import Clock, KubernetesRollout, list_pods
from frontier.targets.kubernetes.status import PodSession, pod_facts
from frontier.targets.kubernetes.weighted import WeightedKubernetesRollout


def kubeconfig_for(settings: Settings) -> tuple[str, str]:
    """(kubeconfig file, context) the stack's cluster is reached with."""
    k = settings.section(Kubernetes)
    if k.cluster.mode == "existing":
        return os.path.expanduser(k.cluster.kubeconfig), k.cluster.context
    path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
    return path, k.cluster.name


class KubernetesBackend(AwsTarget):
    kind = "kubernetes"
    creates_buckets = False

    def __init__(
        self, settings: Settings, pool: PoolSettings | None, api: ApiClient | None = None, clock: Clock | None = None
    ) -> None:
        super().__init__(settings, pool)
        self._api = api
        self.clock = clock or Clock()
        self._pods: dict[str, dict[str, Any]] = {}

    def api(self) -> ApiClient:
        if self._api is None:
            path, context = kubeconfig_for(self.settings)
            if not os.path.exists(path):
                raise FrontierError(
                    f"stack {self.settings.stack!r}: kubeconfig {path} does not exist; for an EKS cluster run "
                    f"`aws eks update-kubeconfig --name {context} --alias {context}`"
                )
            try:
                self._api = kube_config.new_client_from_config(config_file=path, context=context)
            except kube_config.ConfigException as exc:
                raise FrontierError(f"stack {self.settings.stack!r}: kubeconfig {path}: {exc}") from None
        return self._api

    def hosts(self, group: str | None = None) -> list[HostSpec]:
        """The runtime's pods (stable and canary), as ``fab status`` and ``deploy --plan`` list them.

        A rollout does not visit them: the Deployment's controller chooses which pods to replace.
        """
        namespace = self.settings.section(Kubernetes).namespace
        # A disaggregated pool: both halves' pods, each on its half's group, in the order they roll.
        listed = [
            (group or half.group.name, pod)
            for half in pd.role_pools(self.pool)
            for pod in sorted(
                list_pods(self.api(), namespace, m.selector(half)), key=lambda pod: pod["metadata"]["name"]
            )
        ]
        self._pods = {pod["metadata"]["name"]: pod for _, pod in listed}
        return [
            HostSpec(
                name=pod["metadata"]["name"],
                address=str((pod.get("status") or {}).get("podIP") or "-"),
                ssh_port=0,
                root="",
                group=group_name,
                instance_id=str((pod.get("spec") or {}).get("nodeName") or ""),
            )
            for group_name, pod in listed
        ]

    def balancer(self) -> None:
        """None to drive: a terminating pod leaves its Service's endpoints by itself."""
        return None

    def fleet(self, group: str | None = None) -> None:
        """None to drive: the cluster's autoscaler places and scales the pods (KEDA, node pools)."""
        return None

    def connect(self, host: HostSpec) -> Any:
        raise FrontierError(f"stack {self.settings.stack!r}: pods are not reached over SSH (use kubectl)")

    def session(self, host: HostSpec) -> PodSession:
        if host.name not in self._pods:
            self.hosts()
        if host.name not in self._pods:
            raise FrontierError(f"pod {host.name} is gone")
        return PodSession(pod_facts(self._pods[host.name]))

    def outputs(self) -> KubernetesOutputs[str]:
        """What ``pulumi up`` of the stack exported, as saved for ``fab``."""
        return aws.stack_outputs(self.settings, KubernetesOutputs[str])

    def rollout(
        self, reporter: Reporter | None = None, verification: CanaryVerification | None = None
    ) -> KubernetesRollout | PairRollout:
        """The pool's Deployment's rollout, its LeaderWorkerSet's where a replica spans nodes, or
        a disaggregated pool's two Deployments' (prefill, then decode)."""
        if self.pool.disaggregation is not None:
            prefill, decode = (
                KubernetesRollout(
                    self.settings, half, self.api(), reporter, self.clock, verification=verification
                )
                for half in pd.role_pools(self.pool)
            )
            return PairRollout(prefill, decode)
        if lw.replica_spans_nodes(self.pool):
            return LeaderWorkerSetRollout(
                self.settings, self.pool, self.api(), reporter, self.clock, verification=verification
            )
        if self.settings.rollout.traffic_steps:
            return WeightedKubernetesRollout(
                self.settings, self.pool, self.api(), reporter, self.clock, verification=verification
            )
        return KubernetesRollout(
            self.settings, self.pool, self.api(), reporter, self.clock, verification=verification
        )

    def rollout_size(self) -> int:
        """The pods the Deployment may run at most, both halves' of a disaggregated pool (asked
        without the API: it may be unreachable)."""
        return sum(group.max_size for group in self.pool.groups)

    def roll(self, release: Release, kind: str, reporter: Reporter | None) -> RolloutResult:
        # Read (and refused) before anything is touched; only a deploy proves itself on the canary.
        verify = kind == "deploy" and self.settings.rollout.verify_canary
        store = self.history_store() if verify else None
        verification = canary_verification(self.settings, self.pool, self.runtime_key(), store) if store else None
        return self.rollout(reporter, verification).run(release, kind)

    def stack_problems(self) -> Iterator[FieldProblem]:
        return rules.stack_problems(self.settings)

    def rendered_files(self, digest: str) -> dict[str, str]:
        """The cluster's manifests, as ``pulumi up`` applies them."""
        return m.manifest_files(self.settings, digest)
