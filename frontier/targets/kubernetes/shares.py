"""A traffic share as a count of replicas: what a Kubernetes Service can split.

A pool's Service spreads its requests over the ready pods it selects, whichever Deployment runs
them (kube-proxy, or the gateway's connections to the Service's name). So the new release's share
is the canary Deployment's replicas over the pool's: a step of ``rollout.traffic_steps`` asks a
percent, the rollout runs the nearest whole count of canary pods, and that count's share is the
one realised. A step below 100 % is realisable where that count leaves at least one replica on
each release and is above the previous step's (else the step would repeat it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from frontier.config.schema import PoolSettings


def rollout_replicas(pool: PoolSettings) -> int:
    """The replicas a rollout by traffic share holds ``pool`` at: its ``replicas``, else its node
    group's desired_size (one replica per node), at least 1."""
    return max(1, pool.replicas or pool.group.desired_size)


def canary_replicas(percent: int, total: int) -> int:
    """The canary pods nearest ``percent`` % of ``total`` (halves round up)."""
    return math.floor(total * percent / 100 + 0.5)


def share(canary: int, total: int) -> float:
    """The percent of a pool's traffic ``canary`` of its ``total`` ready pods take."""
    return 100 * canary / total


@dataclass(frozen=True)
class Unrealisable:
    """A step that ``total`` replicas cannot run, and the nearest share they can (None: none)."""

    percent: int
    total: int
    canary: int
    nearest: int | None

    def describe(self) -> str:
        got = f"{self.canary} of {self.total} replicas is {share(self.canary, self.total):.0f} %"
        if self.nearest is None:
            return f"step {self.percent} %: {got}, and no share below 100 % is left for it"
        return (
            f"step {self.percent} %: {got}; nearest realisable share: {share(self.nearest, self.total):.0f} % "
            f"({self.nearest} of {self.total} replicas)"
        )


def unrealisable(steps: tuple[int, ...], total: int) -> list[Unrealisable]:
    """The steps ``total`` replicas cannot run as distinct shares of both releases."""
    problems, previous = [], 0
    for percent in steps:
        canary = canary_replicas(percent, total)
        if percent < 100 and not previous < canary < total:
            choices = range(previous + 1, total)
            nearest = min(choices, key=lambda k: abs(share(k, total) - percent), default=None)
            problems.append(Unrealisable(percent, total, canary, nearest))
            continue
        previous = canary
    return problems
