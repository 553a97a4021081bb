"""The seam between what a rollout does and where the fleet runs.

A :class:`Backend` answers the questions every operate task asks of a target: which hosts serve,
how to reach one, which balancer drains them, which AWS clients and history store to use, and
how the operator reaches the API. ``deploy``, ``rollback``, ``status`` and the load test are written
against this protocol only; the target-specific answers live in one class per target.
"""

from __future__ import annotations

from typing import Any, Protocol

from frontier.config.schema import Settings
from frontier.fleet.balancer import Balancer
from frontier.fleet.host import HostSession
from frontier.fleet.inventory import HostSpec
from frontier.release.history import HistoryStore
from frontier.release.release import Release
from frontier.rollout.rolling import Reporter, RolloutResult


class Backend(Protocol):
    settings: Settings
    #: "local", "ec2" or "kubernetes"; printed in tables and history, never branched on outside the factory.
    kind: str
    #: Buckets on this target are created by the toolkit (moto) rather than by Pulumi.
    creates_buckets: bool

    def hosts(self, group: str | None = None) -> list[HostSpec]:
        """The serving hosts (or those of ``group``) in rollout order."""
        ...

    def connect(self, host: HostSpec) -> Any:
        """A Fabric-compatible connection to ``host`` (``run``, ``put``, ``sftp``)."""
        ...

    def session(self, host: HostSpec) -> HostSession:
        """A connection plus the host agent, ready for one command's phases."""
        ...

    def balancer(self) -> Balancer | None:
        """What drains and enables hosts: HAProxy's runtime API or an ALB target group.

        None where the platform takes pods out of its Service itself (Kubernetes).
        """
        ...

    def roll(self, release: Release, kind: str, reporter: Reporter | None) -> RolloutResult:
        """Roll ``release`` over the fleet, restoring what it touched on failure; never raises for a
        failed rollout (the result says so). Host backends run :class:`frontier.rollout.rolling.Rollout`.
        """
        ...

    def aws_client(self, service: str) -> Any:
        """A boto3 client for this target (moto's server on the local stack)."""
        ...

    def history_store(self) -> HistoryStore:
        """Releases, deploy history and the deploy lock of this stack."""
        ...

    def endpoint(self) -> str:
        """The base URL clients use: the balancer's address."""
        ...

    def api_key(self) -> str | None:
        """An API key the operator's tools can use, when the target can tell one."""
        ...
