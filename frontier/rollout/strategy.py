"""How a rollout keeps capacity: surge where the group can grow, else one batch unavailable at a time.

Surge ("先增后减", add first, then remove), for each wave of up to ``rollout.max_surge`` hosts:
launch that many new hosts (each boots the current release and passes the launch hook), roll the
new release onto them through the usual gates (they are extra capacity, so this costs nothing),
and only then retire as many old hosts (scale-in drains them first). Serving capacity never drops
below the group's desired size. A failed wave retires its new hosts; old ones were never touched.

Where the group cannot grow (``max_size`` reached, ``max_surge`` 0, or a fixed fleet such as the
local stack) the rollout takes ``rollout.batch_size`` hosts out at a time, in place, as before.
The choice and its reason are written into the rollout's result and the deploy history.

The mechanics of growing and retiring belong to the target (:class:`Fleet`); the decision and
the order of steps live here, so both can be tested on their own. :func:`roll_hosts` is the one
host rollout every host target runs: the strategy, the group held, and :class:`Rollout` over the hosts.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from frontier.config.schema import PoolSettings, Settings
from frontier.config.schema import Rollout as RolloutSettings
from frontier.errors import FrontierError
from frontier.hosts.balancer import Balancer
from frontier.hosts.inventory import HostSpec
from frontier.release.history import HistoryStore
from frontier.release.release import Release
from frontier.rollout.canary import CanaryVerification
from frontier.rollout.rolling import HostResult, Reporter, Rollout, RolloutResult
from frontier.rollout.weighted import WeightedBalancer, WeightedRollout

SURGE: Final = "surge"
IN_PLACE: Final = "one-unavailable"


@dataclass(frozen=True)
class GroupSize:
    min_size: int
    desired: int
    max_size: int


@dataclass(frozen=True)
class Strategy:
    kind: Literal["surge", "one-unavailable"]
    #: New hosts launched per wave (surge), or hosts out of service at once (in place).
    hosts_per_wave: int
    reason: str

    def describe(self) -> str:
        if self.kind == SURGE:
            return (
                f"surge: +{self.hosts_per_wave} host(s) first, then retire as many old ones ({self.reason})"
            )
        return f"one-unavailable: {self.hosts_per_wave} host(s) out of service at a time ({self.reason})"


def choose(rollout: RolloutSettings, group: GroupSize | None) -> Strategy:
    """Surge when the group can grow by at least one host; in place otherwise, saying why."""
    in_place = rollout.batch_size
    if group is None:
        return Strategy(IN_PLACE, in_place, "a fixed fleet cannot grow")
    if rollout.max_surge == 0:
        return Strategy(IN_PLACE, in_place, "rollout.max_surge is 0")
    room = group.max_size - group.desired
    if room <= 0:
        return Strategy(
            IN_PLACE,
            in_place,
            f"the group is at max_size ({group.max_size} = desired {group.desired}): no room to surge",
        )
    surge = min(rollout.max_surge, room)
    return Strategy(
        SURGE, surge, f"max_size {group.max_size} leaves room for {room} above desired {group.desired}"
    )


class Fleet(Protocol):
    """A group of hosts that can grow and shrink (an auto scaling group)."""

    def size(self) -> GroupSize: ...

    def grow(self, count: int, timeout_s: float) -> list[HostSpec]:
        """Launch ``count`` hosts; return them once in service (they passed the launch hook)."""
        ...

    def retire(self, hosts: list[HostSpec]) -> None:
        """Terminate ``hosts`` and shrink the group by as many (scale-in drains each first)."""
        ...

    def hold(self, hosts: list[HostSpec]) -> contextlib.AbstractContextManager[None]:
        """While a rollout runs: ``hosts`` protected from scale-in, AZ rebalancing suspended."""
        ...


# Runs the usual rollout (canary, batches, gates, restore) over some hosts.
RollHosts = Callable[[list[HostSpec]], RolloutResult]


def surge_waves(old: list[HostSpec], per_wave: int) -> Iterator[list[HostSpec]]:
    for i in range(0, len(old), per_wave):
        yield old[i : i + per_wave]


def surge_rollout(
    fleet: Fleet,
    old_hosts: list[HostSpec],
    strategy: Strategy,
    roll: RollHosts,
    *,
    kind: str,
    release: str,
    launch_timeout_s: float,
) -> RolloutResult:
    """Per wave: grow, roll the release onto the new hosts (gated), then retire old hosts."""
    started = time.monotonic()
    result = RolloutResult(kind=kind, release=release, strategy=strategy.describe())
    retired = {h.name: HostResult(h.name, to_release=release, outcome="untouched") for h in old_hosts}
    result.hosts = list(retired.values())
    for wave in surge_waves(old_hosts, strategy.hosts_per_wave):
        try:
            new = fleet.grow(len(wave), launch_timeout_s)
        except FrontierError as exc:
            result.outcome, result.reason = "failed", f"surge: {exc}"
            break
        rolled = roll(new)
        result.hosts += rolled.hosts
        if rolled.outcome != "succeeded":
            # The wave's new hosts go; the old ones never left service.
            fleet.retire(new)
            for new_host in rolled.hosts:
                new_host.outcome = "retired"
            result.outcome, result.reason = "rolled_back", rolled.reason
            break
        fleet.retire(wave)
        for host in wave:
            retired[host.name].outcome = "retired"
    result.duration_s = round(time.monotonic() - started, 3)
    return result


def roll_hosts(
    settings: Settings,
    pool: PoolSettings,
    store: HistoryStore,
    hosts: list[HostSpec],
    balancer: Balancer,
    connect: Callable[[HostSpec], Any],
    release: Release,
    kind: str,
    reporter: Reporter | None,
    *,
    group: Fleet | None = None,
    surge: bool = False,
    launch_timeout_s: float = 0.0,
    verification: CanaryVerification | None = None,
    in_place_reason: str = "",
) -> RolloutResult:
    """Roll ``release`` over ``hosts``, ``pool``'s, behind ``balancer``: the host rollout of every
    host target.

    The wheel (where the release has one) comes from the history first. ``group``, the node group
    the hosts belong to, holds them against scale-in while the rollout runs. Where ``surge`` is
    allowed and the group's max_size leaves room, each wave of new hosts launches first (within
    ``launch_timeout_s``) and as many old ones retire after it; otherwise ``rollout.batch_size``
    hosts go out of service at a time, in place. The result says which and why. ``verification``
    (from :func:`frontier.rollout.canary.canary_verification`) runs the stack's verification set on
    the canary before the rollout goes on. ``in_place_reason`` is why a caller that holds a group
    does not let it surge (its replicas span several nodes): the strategy then says so. A stack
    with ``rollout.traffic_steps`` rolls by traffic share instead (frontier.rollout.weighted), in
    place, through the balancer's weights.
    """
    if settings.rollout.traffic_steps:
        # By traffic share: in place (no surge), the group held.
        if not isinstance(balancer, WeightedBalancer):
            # Each target refuses the setting at load where its balancer has no weights; never ignored.
            raise FrontierError(
                f"rollout.traffic_steps {list(settings.rollout.traffic_steps)}: this target's balancer "
                f"({type(balancer).__name__}) cannot split traffic by weight"
            )
        wheel = _wheel(store, release)
        with _held(group, hosts):
            weighted = WeightedRollout(settings, pool, hosts, balancer, connect, reporter, verification)
            return weighted.run(release, wheel, kind)
    strategy = choose(settings.rollout, group.size() if group is not None and surge else None)
    if group is not None and not surge and in_place_reason:  # the caller's own reason not to surge
        strategy = Strategy(IN_PLACE, settings.rollout.batch_size, in_place_reason)
    wheel = _wheel(store, release)

    def roll(over: list[HostSpec]) -> RolloutResult:
        rollout = Rollout(settings, pool, over, balancer, connect, reporter, verification)
        # A surge wave's hosts are all new: its canary is judged against a host of the old release.
        rollout.peers = list(hosts)
        return rollout.run(release, wheel, kind)

    with _held(group, hosts):
        if group is not None and strategy.kind == SURGE:
            return surge_rollout(
                group,
                hosts,
                strategy,
                roll,
                kind=kind,
                release=release.id,
                launch_timeout_s=launch_timeout_s,
            )
        result = roll(hosts)
    result.strategy = strategy.describe()
    return result


def _wheel(store: HistoryStore, release: Release) -> Path | None:
    """The release's wheel, from the history, where its artifact is one."""
    return store.fetch_artifact(release.artifact) if release.artifact.kind == "wheel" else None


def _held(group: Fleet | None, hosts: list[HostSpec]) -> contextlib.AbstractContextManager[None]:
    """``hosts`` held against ``group``'s scale-in for the length of the ``with`` (no group: nothing)."""
    return group.hold(hosts) if group is not None else contextlib.nullcontext()
