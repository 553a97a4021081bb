"""The embedded local stack: host slots on loopback aliases, HAProxy, and moto for AWS.

Hosts run the runtime with this toolkit's own interpreter (the venv that has torch); where no
sshd exists they are driven through a local connection instead of SSH.
"""

from __future__ import annotations

import sys
from typing import Any

from frontier import project
from frontier.backends.common import BackendBase
from frontier.contracts import HAPROXY_ADMIN_SOCKET
from frontier.fleet.balancer import Balancer, HAProxyBalancer
from frontier.fleet.inventory import HostSpec, LocalConnection, static_hosts
from frontier.local import cluster
from frontier.release.history import HistoryStore


class LocalBackend(BackendBase):
    kind = "local"
    creates_buckets = True

    def hosts(self, group: str | None = None) -> list[HostSpec]:
        group_name = group or self.settings.serving_group.name
        return static_hosts(
            self.settings, group_name, python=sys.executable, resolve_root=lambda p: str(project.resolve(p))
        )

    def connect(self, host: HostSpec) -> Any:
        if cluster.connection_mode(self.settings) == "local":
            return LocalConnection(host)
        return super().connect(host)

    def balancer(self) -> Balancer:
        return HAProxyBalancer(self.admin_socket())

    def admin_socket(self) -> str:
        assert self.settings.local is not None
        return str(project.resolve(f"{self.settings.local.state_dir}/{HAPROXY_ADMIN_SOCKET}"))

    def history_store(self) -> HistoryStore:
        store = self._history(cluster.history_bucket(self.settings), f"history/{self.settings.stack}/")
        store.ensure_bucket()
        return store

    def endpoint(self) -> str:
        return cluster.balancer_url(self.settings)

    def api_key(self) -> str | None:
        return cluster.api_key(self.settings)
