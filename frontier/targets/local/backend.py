"""The embedded local stack: host slots on loopback aliases, HAProxy, and moto for AWS.

Hosts run the runtime with this toolkit's own interpreter (the venv that has torch); where no
sshd exists they are driven through a local connection instead of SSH. The serving hosts are the
slots in service in the stack's :class:`~frontier.targets.local.group.LocalFleet` (the local
stand-in for an auto scaling group): a rollout holds them against scale-in while it runs, and never
surges (the slots are few, and the spare ones are the autoscaler's).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from frontier_hostside.names import HAPROXY_ADMIN_SOCKET
from frontier_settings import FieldProblem

from frontier import project
from frontier.config.schema import Local, PoolSettings, Settings
from frontier.hosts.inventory import HostSpec, ssh_connection
from frontier.hosts.session import HostSession
from frontier.release.history import HistoryStore, stack_history
from frontier.release.release import Release
from frontier.rollout.canary import canary_verification
from frontier.rollout.rolling import Reporter, RolloutResult
from frontier.rollout.strategy import roll_hosts
from frontier.rollout.target import PoolTarget
from frontier.targets.local import cluster, rules
from frontier.targets.local import gateway as local_gateway
from frontier.targets.local.balancer import HAProxyBalancer, balancer_backends, render_haproxy
from frontier.targets.local.connection import LocalConnection
from frontier.targets.local.group import LocalFleet, read_state, slot_specs


def slots_in_service(settings: Settings) -> list[tuple[PoolSettings, HostSpec]]:
    """Every slot of the stack in service, with the pool it serves, from one read of the fleet's
    state (a spare slot, which every pool's group may launch, once: with the first pool)."""
    in_service = set(read_state(settings, cluster.state_dir(settings)).in_service)
    serving: dict[str, tuple[PoolSettings, HostSpec]] = {}
    for pool in settings.pools:
        for host in slot_specs(settings, pool, None):
            if host.name in in_service:
                serving.setdefault(host.name, (pool, host))
    return list(serving.values())


class LocalBackend(PoolTarget):
    kind = "local"
    creates_buckets = True

    def hosts(self, group: str | None = None) -> list[HostSpec]:
        """The pool's slots in service (and any spare slot that serves), in the stack's order."""
        slots = slot_specs(self.settings, self.pool, group)
        serving = set(read_state(self.settings, cluster.state_dir(self.settings)).in_service)
        return [h for h in slots if h.name in serving]

    def fleet(self, group: str | None = None) -> LocalFleet:
        return LocalFleet(
            self.settings,
            self.pool,
            self.history_store,
            self.balancer(),
            self.connect,
            state_dir=cluster.state_dir(self.settings),
        )

    def rollout_size(self) -> int:
        return len(self.hosts())

    def roll(self, release: Release, kind: str, reporter: Reporter | None) -> RolloutResult:
        """One batch out of service at a time over the slots in service, held against scale-in."""
        store = self.history_store()
        return roll_hosts(
            self.settings,
            self.pool,
            store,
            self.hosts(),
            self.balancer(),
            self.connect,
            release,
            kind,
            reporter,
            group=self.fleet(),
            # A rollback returns to a release that served; only a deploy proves itself on the canary.
            verification=canary_verification(
                self.settings, self.pool, cluster.api_key(self.settings, self.pool), store
            )
            if kind == "deploy" and self.settings.rollout.verify_canary
            else None,
        )

    def aws_client(self, service: str) -> Any:
        return cluster.aws_client(self.settings, service)

    def connect(self, host: HostSpec) -> Any:
        if cluster.connection_mode(self.settings) == "local":
            return LocalConnection(host)
        return ssh_connection(self.settings, host)

    def session(self, host: HostSpec) -> HostSession:
        return HostSession(self.settings, self.pool, host, self.connect(host))

    def balancer(self) -> HAProxyBalancer:
        return HAProxyBalancer(self.admin_socket())

    def admin_socket(self) -> str:
        local = self.settings.section(Local)
        return str(project.resolve(f"{local.state_dir}/{HAPROXY_ADMIN_SOCKET}"))

    def history_store(self) -> HistoryStore:
        store = stack_history(
            self.settings,
            self.pool.name,
            self.aws_client("s3"),
            cluster.history_bucket(self.settings),
            cluster.history_prefix(self.settings),
        )
        store.ensure_bucket()
        return store

    def endpoint(self) -> str:
        # A stack with a gateway is reached through it, as the ALB forwards only to the gateway on
        # EC2: HAProxy in front of several pools would send a request to any model's runtime.
        if self.settings.gateway is not None:
            return local_gateway.gateway_url(self.settings)
        return cluster.balancer_url(self.settings)

    def api_key(self) -> str | None:
        # The gateway takes tenants' keys only, and which tenant a caller acts as is the caller's to say.
        if self.settings.gateway is not None:
            return None
        return cluster.api_key(self.settings, self.pool)

    def api_keys_rotated(self, secret_id: str) -> str | None:
        """The local stack keeps a client copy of its runtimes' first key (``local.up`` writes it for
        the demo, ``fab loadtest`` and ``fab verify``): after a rotation it is the retired key, so it
        is read again from the secret, as the deploy role that rotated it."""
        return cluster.refresh_api_key(self.settings, secret_id, self.aws_client("secretsmanager"))

    def stack_problems(self) -> Iterator[FieldProblem]:
        return rules.stack_problems(self.settings)

    def rendered_files(self, digest: str) -> dict[str, str]:
        """The balancer's haproxy.cfg, as ``local.up`` starts HAProxy with it (paths as written)."""
        local = self.settings.section(Local)
        return {
            "balancer/haproxy.cfg": render_haproxy(
                self.settings,
                balancer_backends(self.settings),
                bind_port=local.balancer_port,
                stats_socket=f"{local.state_dir}/{HAPROXY_ADMIN_SOCKET}",
                stats_port=local.balancer_stats_port,
            )
        }
