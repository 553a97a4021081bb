"""Kubernetes: the runtime is a Deployment; Kubernetes places, drains and rolls its pods.

``fab deploy`` and ``fab rollback`` keep their meaning: the release goes through a canary
Deployment and the metric gate, then the Deployment rolls it with the stack's surge settings (see
:mod:`frontier.kubernetes.rollout`). History, releases and the deploy lock live in the same S3
bucket and format as on EC2 (the ``history_bucket`` / ``history_prefix`` stack outputs).

The cluster is reached with the official ``kubernetes`` client from a kubeconfig: the stack's own
(``kubernetes.cluster.kubeconfig`` / ``context``) for an existing cluster; for one the stack
created, ``$KUBECONFIG`` (else ``~/.kube/config``) with the context named like the cluster, as
``aws eks update-kubeconfig --name <cluster> --alias <cluster>`` writes it.
"""

from __future__ import annotations

import os
from typing import Any

from kubernetes import config as kube_config
from kubernetes.client import ApiClient

from frontier import aws
from frontier.backends.common import BackendBase
from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.fleet.inventory import HostSpec
from frontier.kubernetes import manifests as m
from frontier.kubernetes.rollout import Clock, KubernetesRollout, list_pods
from frontier.kubernetes.status import PodSession, pod_facts
from frontier.release.history import HistoryStore
from frontier.release.release import Release
from frontier.rollout.rolling import Reporter, RolloutResult


def kubeconfig_for(settings: Settings) -> tuple[str, str]:
    """(kubeconfig file, context) the stack's cluster is reached with."""
    k = settings.kubernetes
    if k is None:
        raise FrontierError(f"stack {settings.stack!r} has no 'frontier:kubernetes' section")
    if k.cluster.mode == "existing":
        return os.path.expanduser(k.cluster.kubeconfig), k.cluster.context
    path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
    return path, k.cluster.name


class KubernetesBackend(BackendBase):
    kind = "kubernetes"

    def __init__(self, settings: Settings, api: ApiClient | None = None, clock: Clock | None = None) -> None:
        super().__init__(settings)
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
        assert self.settings.kubernetes is not None
        pods = list_pods(self.api(), self.settings.kubernetes.namespace, m.selector(self.settings))
        self._pods = {pod["metadata"]["name"]: pod for pod in pods}
        group_name = group or self.settings.serving_group.name
        return [
            HostSpec(
                name=name,
                address=str((pod.get("status") or {}).get("podIP") or "-"),
                ssh_port=0,
                root="",
                group=group_name,
                instance_id=str((pod.get("spec") or {}).get("nodeName") or ""),
            )
            for name, pod in sorted(self._pods.items())
        ]

    def balancer(self) -> None:
        """None to drive: a terminating pod leaves its Service's endpoints by itself."""
        return None

    def connect(self, host: HostSpec) -> Any:
        raise FrontierError(f"stack {self.settings.stack!r}: pods are not reached over SSH (use kubectl)")

    def session(self, host: HostSpec) -> PodSession:  # type: ignore[override]
        if host.name not in self._pods:
            self.hosts()
        if host.name not in self._pods:
            raise FrontierError(f"pod {host.name} is gone")
        return PodSession(pod_facts(self._pods[host.name]))

    def history_store(self) -> HistoryStore:
        return self._outputs_history()

    def endpoint(self) -> str:
        assert self.settings.kubernetes is not None
        return str(
            aws.stack_outputs(self.settings).get("endpoint")
            or f"https://{self.settings.kubernetes.ingress.host}"
        )

    def api_key(self) -> str | None:
        return None

    def rollout(self, reporter: Reporter | None = None) -> KubernetesRollout:
        return KubernetesRollout(self.settings, self.api(), reporter, self.clock)

    def roll(self, release: Release, kind: str, reporter: Reporter | None) -> RolloutResult:
        return self.rollout(reporter).run(release, kind)
