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


class Backend(Protocol):
    settings: Settings
    #: "local" or "ec2"; printed in tables and history, never branched on outside the factory.
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

    def balancer(self) -> Balancer:
        """What drains and enables hosts: HAProxy's runtime API or an ALB target group."""
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
