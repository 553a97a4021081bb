"""What every backend does the same way, given its hosts, connections and AWS clients."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from frontier import aws
from frontier.config.schema import Settings
from frontier.fleet.balancer import Balancer
from frontier.fleet.host import HostSession
from frontier.fleet.inventory import HostSpec, ssh_connection
from frontier.release.history import HistoryStore
from frontier.release.release import Release
from frontier.rollout.rolling import Reporter, Rollout, RolloutResult
from frontier.rollout.strategy import choose


def roll_hosts(
    settings: Settings,
    store: HistoryStore,
    hosts: list[HostSpec],
    balancer: Balancer,
    connect: Callable[[HostSpec], Any],
    release: Release,
    kind: str,
    reporter: Reporter | None,
) -> RolloutResult:
    """The host rollout every host backend shares: the wheel (if any) from the history, then Rollout."""
    wheel = store.fetch_artifact(release.artifact) if release.artifact.kind == "wheel" else None
    return Rollout(settings, hosts, balancer, connect, reporter).run(release, wheel, kind)


class BackendBase:
    kind = "base"
    creates_buckets = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def aws_client(self, service: str) -> Any:
        return aws.client(self.settings, service)

    def connect(self, host: HostSpec) -> Any:
        return ssh_connection(self.settings, host)

    def session(self, host: HostSpec) -> HostSession:
        return HostSession(self.settings, host, self.connect(host))

    def roll(self, release: Release, kind: str, reporter: Reporter | None) -> RolloutResult:
        balancer = self.balancer()  # type: ignore[attr-defined]
        hosts = self.hosts()  # type: ignore[attr-defined]
        store = self.history_store()  # type: ignore[attr-defined]
        result = roll_hosts(self.settings, store, hosts, balancer, self.connect, release, kind, reporter)
        # A fixed set of hosts cannot grow: always one batch out of service at a time.
        result.strategy = choose(self.settings.rollout, None).describe()
        return result

    def fleet(self, group: str | None = None) -> Any:
        """The node group as a group that can grow and shrink; None where the hosts are fixed."""
        return None

    def _outputs_history(self) -> HistoryStore:
        """The history bucket and prefix a cloud stack's Pulumi outputs name."""
        outputs = aws.stack_outputs(self.settings)
        prefix = str(outputs.get("history_prefix") or f"history/{self.settings.stack}/")
        return self._history(aws.stack_output(self.settings, "history_bucket"), prefix)

    def _history(self, bucket: str, prefix: str) -> HistoryStore:
        stack_prefix = prefix
        if self.settings.models:
            # A stack of several models keeps each pool's releases, history and lock apart; the
            # artifacts (runtime wheels and images) stay the stack's.
            prefix = f"{prefix.rstrip('/')}/models/{self.settings.model.name}/"
        return HistoryStore(
            self.aws_client("s3"), bucket, self.settings.stack, prefix, artifacts_prefix=stack_prefix
        )
