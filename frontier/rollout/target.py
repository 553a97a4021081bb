"""What ``deploy``, ``rollback`` and ``deploy --plan`` ask of the place a stack runs, as protocols.

Every target's backend answers them (:class:`frontier.targets.base.Backend` is :class:`Target`
plus what the operator's other tasks ask); this room only names the shape, never a target. Each
backend starts from :class:`PoolTarget`, the pool it acts for.
"""

from __future__ import annotations

from typing import Protocol

from frontier.config.load import acting_pool
from frontier.config.schema import PoolSettings, Settings
from frontier.hosts.inventory import HostSpec
from frontier.release.history import HistoryStore
from frontier.release.release import Release
from frontier.rollout.rolling import Reporter, RolloutResult


class Facts(Protocol):
    """What a host (or pod) runs and whether it serves, as ``fab status`` and the plan show it."""

    @property
    def current(self) -> str: ...
    @property
    def previous(self) -> str: ...
    @property
    def digest(self) -> str: ...
    @property
    def running(self) -> bool: ...
    @property
    def ready(self) -> bool: ...
    @property
    def live(self) -> bool: ...
    @property
    def restarts(self) -> int: ...
    @property
    def last_restart(self) -> str: ...

    def runs(self, release_id: str) -> bool:
        """It serves ``release_id`` now: a rollout of that release skips it."""
        ...


class Session(Protocol):
    """One host (or pod) during one command: asked what it runs, then closed."""

    def facts(self, release_id: str = "") -> Facts:
        """What it runs; with ``release_id``, also whether that release is staged there."""
        ...

    def status(self) -> Facts:
        """What it runs, with readiness, liveness, the image digest and the restarts."""
        ...

    def close(self) -> None: ...


class Target(Protocol):
    """Where a release is rolled: its hosts (or pods), its history and its own way of rolling."""

    @property
    def settings(self) -> Settings: ...

    @property
    def pool(self) -> PoolSettings:
        """The pool the release is rolled for: its model, runtime and node group."""
        ...

    def hosts(self, group: str | None = None) -> list[HostSpec]:
        """The serving hosts (or pods, or those of ``group``) in rollout order."""
        ...

    def session(self, host: HostSpec) -> Session:
        """``host``, ready to say what it runs."""
        ...

    def history_store(self) -> HistoryStore:
        """Releases, deploy history and the deploy lock of this stack."""
        ...

    def rollout_size(self) -> int:
        """How many hosts (or pods) a rollout may take through its steps; the deploy lock's lease is
        sized by it."""
        ...

    def roll(self, release: Release, kind: str, reporter: Reporter | None) -> RolloutResult:
        """Roll ``release`` over the fleet, restoring what it touched on failure; never raises for a
        failed rollout (the result says so)."""
        ...


class PoolTarget:
    """A target of ``settings``, acting for one of its pools (``backend_for``: the one its entry
    point chose, or None for the whole stack)."""

    def __init__(self, settings: Settings, pool: PoolSettings | None) -> None:
        self.settings = settings
        self._pool = pool

    @property
    def pool(self) -> PoolSettings:
        """The pool this backend acts for; refused where it was built for a stack of several."""
        return acting_pool(self.settings, self._pool)
