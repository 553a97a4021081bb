"""The seam between what the operator's tasks do and where the fleet runs.

A :class:`Backend` answers everything a task asks of a target: which hosts (or pods) serve, how to
reach one and what it runs, which balancer drains them, which group grows and shrinks, how a
release rolls, which AWS clients and history store to use, where clients reach the API, which
stack rules and rendered files are the target's own. ``deploy``, ``rollback``, ``status``, ``scale``,
``render`` and the load test are written against this protocol only; each target answers it with
one class in its own room (``frontier.targets.local|ec2|kubernetes``), and
:func:`frontier.targets.backend_for` is the one place that picks the class.

What ``deploy`` and ``rollback`` ask (:class:`~frontier.rollout.target.Target`, with
:class:`Session` and :class:`Facts`) is named in the rollout room below, so that room can take a
Backend without knowing this one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from frontier_settings import FieldProblem

from frontier.hosts.balancer import Balancer
from frontier.hosts.inventory import HostSpec
from frontier.rollout.strategy import Fleet, GroupSize
from frontier.rollout.target import Facts, Session, Target

__all__ = ["Backend", "Facts", "Group", "Session"]


class Group(Fleet, Protocol):
    """A node group that grows and shrinks: an auto scaling group, or the local slots standing in for one."""

    @property
    def name(self) -> str: ...

    def scale(self, replicas: int) -> GroupSize:
        """Set how many hosts serve; a number outside min_size..max_size is refused, nothing changes."""
        ...


class Backend(Target, Protocol):
    """One target of a stack, as every caller uses it (``deploy`` and ``rollback`` ask the
    :class:`~frontier.rollout.target.Target` part: settings, hosts, session, history, roll)."""

    #: "local", "ec2" or "kubernetes"; printed in tables and history, never branched on outside the factory.
    kind: str
    #: Buckets on this target are created by the toolkit (moto) rather than by Pulumi.
    creates_buckets: bool

    def connect(self, host: HostSpec) -> Any:
        """A Fabric-compatible connection to ``host`` (``run``, ``put``, ``sftp``)."""
        ...

    def balancer(self) -> Balancer | None:
        """What drains and enables hosts: HAProxy's runtime API or an ALB target group.

        None where the platform takes pods out of its Service itself (Kubernetes).
        """
        ...

    def fleet(self, group: str | None = None) -> Group | None:
        """The node group (``group``, else the serving one) as a group that grows and shrinks;
        None where the hosts are fixed or the platform scales its pods itself."""
        ...

    def aws_client(self, service: str) -> Any:
        """A boto3 client for this target (moto's server on the local stack)."""
        ...

    def endpoint(self) -> str:
        """The base URL clients use: the gateway's on a stack with one (tenants, priorities and
        metering apply there), else the balancer's. The operator's tasks that need the runtimes
        themselves go through :meth:`balancer` or the hosts, never through this address."""
        ...

    def api_key(self) -> str | None:
        """An API key the operator's tools can use at :meth:`endpoint`, when the target can tell
        one; None on a stack with a gateway, where the caller names its tenant by its key."""
        ...

    def api_keys_rotated(self, secret_id: str) -> str | None:
        """After ``keys.rotate`` published a new first key in ``secret_id``: bring the target's own
        copy of a client key up to date, and say what changed; None where the target keeps no copy
        (its clients read the secret, as the gateway does)."""
        ...

    def stack_problems(self) -> Iterator[FieldProblem]:
        """What this target refuses in a stack file, beyond the rules every stack is held to."""
        ...

    def rendered_files(self, digest: str) -> dict[str, str]:
        """The target's own files ``fab render`` writes beside every stack's (relative path: text)."""
        ...
