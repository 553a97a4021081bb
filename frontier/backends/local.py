"""The embedded local stack: host slots on loopback aliases, HAProxy, and moto for AWS.

Hosts run the runtime with this toolkit's own interpreter (the venv that has torch); where no
sshd exists they are driven through a local connection instead of SSH. The serving hosts are the
slots in service in the stack's :class:`~frontier.local.group.LocalFleet` (the local stand-in for an
auto scaling group): a rollout holds them against scale-in while it runs.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from frontier import project
from frontier.backends.common import BackendBase, roll_hosts
from frontier.contracts import HAPROXY_ADMIN_SOCKET
from frontier.fleet.balancer import Balancer, HAProxyBalancer
from frontier.fleet.inventory import HostSpec, LocalConnection, static_hosts
from frontier.local import cluster
from frontier.local.group import LocalFleet, read_state
from frontier.release.history import HistoryStore
from frontier.release.release import Release
from frontier.rollout.rolling import Reporter, RolloutResult
from frontier.rollout.strategy import choose


class LocalBackend(BackendBase):
    kind = "local"
    creates_buckets = True

    def hosts(self, group: str | None = None) -> list[HostSpec]:
        group_name = group or self.settings.serving_group.name
        slots = static_hosts(
            self.settings, group_name, python=sys.executable, resolve_root=lambda p: str(project.resolve(p))
        )
        serving = set(read_state(self.settings, cluster.state_dir(self.settings)).in_service)
        return [h for h in slots if h.name in serving]

    def fleet(self, group: str | None = None) -> LocalFleet:
        return LocalFleet(
            self.settings,
            self.history_store,
            self.balancer(),
            self.connect,
            state_dir=cluster.state_dir(self.settings),
        )

    def roll(self, release: Release, kind: str, reporter: Reporter | None) -> RolloutResult:
        """One batch out of service at a time over the slots in service, held against scale-in."""
        hosts, fleet = self.hosts(), self.fleet()
        with fleet.hold(hosts) if hosts else contextlib.nullcontext():
            result = roll_hosts(
                self.settings,
                self.history_store(),
                hosts,
                self.balancer(),
                self.connect,
                release,
                kind,
                reporter,
            )
        result.strategy = choose(self.settings.rollout, None).describe()
        return result

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
