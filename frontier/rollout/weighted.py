"""The traffic-weighted rollout: the new release takes a growing share of a pool's traffic, step by step.

``rollout.traffic_steps`` (e.g. ``[5, 25, 50, 100]``) names the shares. The canary hosts
(``rollout.canary_hosts``, at least one, never every host) take the new release first, through the
host rollout's own switch (drain, stop, swap, start, readiness, enable), while the balancer gives
them no traffic; the verification set runs on them where ``rollout.verify_canary`` asks. Then, step
by step, the balancer's weights send that percent of the pool's traffic to the new release and the
rest to the old one. Each step holds ``rollout.gate.window_s`` (window after window, up to
:data:`MAX_WINDOWS`, until the new release has served ``gate.min_requests``: a 1 % step on a quiet
pool sees few requests) and is gated on each release's own series over the same window, its hosts'
/metrics summed: the new release's error rate and p99 against the stack's limits, and its p99
against the old release's (``gate.max_p99_ratio``). After the 100 % step the old hosts, serving
nothing by then, switch in batches of ``rollout.batch_size``, and the weights go back to even.

A failed step, or any other failure, reverts: all traffic back on the old release first, then the
canary hosts drained and returned to the release they ran, then even weights. The result (and so
the deploy history) holds every step taken, with both releases' series and the reason.

The invariant: after every step of the rollout and of its revert, at least one replica of the pool
is routable (in the balancer, passing its health check, with a weight above zero). The rollout
reads it from the balancer after each step; a step that leaves none stops the rollout, which
reverts. Between two steps a balancer raises weights before it lowers any, so no moment in between
leaves every weight at zero.

The balancer carries the weights (:class:`WeightedBalancer`); a target whose balancer cannot refuses
``rollout.traffic_steps`` when the stack loads.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar, runtime_checkable

from frontier.config.schema import Gate, PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.hosts.balancer import Balancer
from frontier.hosts.inventory import HostSpec
from frontier.release.release import Release
from frontier.rollout.canary import CanaryVerification
from frontier.rollout.gate import GateReading, judge, judge_relative, read_series
from frontier.rollout.rolling import (
    Event,
    HostResult,
    Reporter,
    Rollout,
    RolloutResult,
    TrafficStep,
)

#: A step holds at most this many gate windows waiting for the new release's ``gate.min_requests``.
MAX_WINDOWS: Final = 10
#: Replicas that must stay routable at every step: one serves; none is an outage.
ROUTABLE_FLOOR: Final = 1
#: What serves a release during a step: a host, or a pod (by name).
Member = TypeVar("Member")


class RoutableLost(FrontierError):
    """A step left fewer routable replicas than the floor."""


@runtime_checkable
class WeightedBalancer(Balancer, Protocol):
    """A balancer that splits a pool's traffic between two sets of hosts by weight."""

    def split(self, new: list[HostSpec], old: list[HostSpec], percent: int) -> None:
        """``percent`` % of the traffic to ``new``, the rest to ``old``; weights that rise are set
        before weights that fall."""
        ...

    def even(self, hosts: list[HostSpec]) -> None:
        """Every host back to the weight it was configured with (rises first, as in :meth:`split`)."""
        ...

    def routable(self, hosts: list[HostSpec]) -> list[str]:
        """The names of ``hosts`` the balancer would send a request to now: in rotation, passing its
        health check, with a weight above zero."""
        ...


def describe(settings: Settings) -> str:
    rollout = settings.rollout
    steps = " -> ".join(f"{step} %" for step in rollout.traffic_steps)
    return (
        f"weighted: {steps} of traffic on {max(1, rollout.canary_hosts)} canary host(s), then the rest "
        f"{rollout.batch_size} at a time (rollout.traffic_steps)"
    )


@dataclass(frozen=True)
class StepGate(Generic[Member]):
    """How a traffic step is held and judged, whatever serves the releases (hosts, pods): each
    release's series, its members' /metrics summed (``scrape``), read before and after the gate's
    window, window after window (up to :data:`MAX_WINDOWS`) until the new release has served
    ``gate.min_requests``; then the new release's judged against the stack's limits and against
    the old release's over the same window."""

    gate: Gate
    scrape: Callable[[list[Member]], dict[str, str]]
    excluded_routes: set[str]
    report: Reporter
    sleep: Callable[[float], None] = time.sleep

    def hold(self, step: TrafficStep, members: Callable[[], tuple[list[Member], list[Member]]]) -> str | None:
        """The verdict on ``step``, recorded on it; None where it passed. ``members`` (the new
        release's, the old release's) are asked for only where the step is gated."""
        gate, label = self.gate, f"{step.percent}%"
        if gate.window_s <= 0:
            step.outcome, step.reason = "passed", "not gated: rollout.gate.window_s is 0"
            self.report(Event(label, "step", "info", step.reason))
            return None
        started = time.monotonic()
        new, old = members()
        before_new, before_old = self.scrape(new), self.scrape(old)
        reading = old_reading = GateReading(0, 0, None)
        for _ in range(MAX_WINDOWS):
            self.sleep(gate.window_s)
            reading = read_series(before_new, self.scrape(new), self.excluded_routes)
            old_reading = read_series(before_old, self.scrape(old), self.excluded_routes)
            if reading.requests >= gate.min_requests:
                break
        step.new, step.old = reading.describe(), old_reading.describe()
        verdict = judge(reading, gate) or judge_relative(reading, old_reading, gate)
        elapsed = time.monotonic() - started
        if verdict:
            step.outcome, step.reason = "failed", verdict
            self.report(Event(label, "step", "fail", verdict, elapsed))
            return verdict
        step.outcome = "passed"
        self.report(Event(label, "step", "ok", f"new release: {step.new}; old release: {step.old}", elapsed))
        return None


class WeightedRollout(Rollout):
    """Rolls one release over a pool's hosts by traffic share; reverts on any failure."""

    def __init__(
        self,
        settings: Settings,
        pool: PoolSettings,
        hosts: list[HostSpec],
        balancer: WeightedBalancer,
        connect: Callable[[HostSpec], Any],
        reporter: Reporter | None = None,
        verification: CanaryVerification | None = None,
    ) -> None:
        super().__init__(settings, pool, hosts, balancer, connect, reporter, verification)
        self.weights = balancer
        #: Whether any weight was changed: a rollout refused before that has nothing to put back.
        self.shifted = False
        self.results: dict[str, HostResult] = {}

    def run(self, release: Release, wheel: Any, kind: str = "deploy") -> RolloutResult:
        started = time.monotonic()
        result = RolloutResult(kind=kind, release=release.id, strategy=describe(self.settings))
        results = {h.name: HostResult(h.name, to_release=release.id) for h in self.hosts}
        self.results = results
        result.hosts = list(results.values())
        touched: list[HostSpec] = []
        new: list[HostSpec] = []
        old: list[HostSpec] = []
        try:
            self._refuse_what_cannot_split()
            todo = self._check_and_stage(release, wheel, results)
            serving = [h for h in todo if results[h.name].from_release]
            if todo and not serving:
                # Nothing serves yet (the stack's first release): there is no traffic to shift, and
                # nothing routable to keep. The hosts take it in batches, as the host rollout does.
                self.report(Event("-", "step", "info", "no host serves a release yet: rolled by batch"))
                result.strategy += "; nothing served yet, so rolled by batch"
                self.close()
                return super().run(release, wheel, kind)
            canaries = self._canaries(todo, serving)
            old = [h for h in todo if h not in canaries]
            new = [h for h in self.hosts if h not in old]  # the canaries and hosts already on it
            target = {h.name: release.id for h in todo}
            if canaries and not old:
                # The pool's other hosts run the release already: nothing is left to split against.
                self._switch(canaries, results, target, touched)
                self._invariant("the last host switched")
            elif canaries:
                self._traffic_steps(result, results, target, touched, canaries, new, old)
            self._updated(todo, results)
        except (Exception, KeyboardInterrupt) as exc:  # any failure, ours, the network's or Ctrl-C, reverts
            self._stopped(result, exc)
            result.outcome = "rolled_back" if self._revert(touched, results, new, old) else "failed"
        finally:
            result.duration_s = round(time.monotonic() - started, 3)
            self.close()
        return result

    def _refuse_what_cannot_split(self) -> None:
        """Before any host is touched: a split needs two hosts (a replica over several nodes is
        refused when the stack loads: its nodes cannot take different shares)."""
        if len(self.hosts) < 2:
            raise FrontierError(
                f"rollout.traffic_steps splits a pool's traffic between two releases on separate hosts; "
                f"this pool has {len(self.hosts)} serving host(s), it needs at least 2"
            )

    def _canaries(self, todo: list[HostSpec], serving: list[HostSpec]) -> list[HostSpec]:
        """``rollout.canary_hosts`` of ``todo``, at least one, leaving at least one of ``serving`` (the
        hosts that serve the old release) out, to carry the traffic the canaries do not take. Where
        only one host is left to do, the pool's others run the release already: it is the canary."""
        if len(todo) == 1:
            return todo
        wanted = min(max(1, self.settings.rollout.canary_hosts), len(todo) - 1)
        keep = serving[-1]  # the last host of the old release to switch
        return [h for h in todo if h is not keep][:wanted]

    def _traffic_steps(
        self,
        result: RolloutResult,
        results: dict[str, HostResult],
        target: dict[str, str],
        touched: list[HostSpec],
        canaries: list[HostSpec],
        new: list[HostSpec],
        old: list[HostSpec],
    ) -> None:
        # The canaries take no traffic once back in rotation, until the first step gives them some.
        self.shifted = True
        self.weights.split(new, old, 0)
        self._invariant("the new release's hosts set to 0 % of traffic")
        self._switch(canaries, results, target, touched)
        self._invariant("the canary switched, at 0 % of traffic")
        self._verify(canaries, results, next(h for h in old if self._serves(h)))
        for percent in self.settings.rollout.traffic_steps:
            step = TrafficStep(percent)
            result.steps.append(step)
            self.report(Event(f"{percent}%", "step", "start", f"{percent} % of traffic on the new release"))
            self.weights.split(new, old, percent)
            step.routable = self._invariant(f"{percent} % of traffic on the new release")
            self._hold_and_gate(step, new, old)
        # The old hosts serve nothing now: each batch switches while the new release carries the pool.
        batch = self.settings.rollout.batch_size
        for i in range(0, len(old), batch):
            self._switch(old[i : i + batch], results, target, touched)
            self._invariant(f"batch {i // batch + 1} of the old hosts switched")
        self.weights.even(self.hosts)
        self._invariant("weights even again")

    def _serves(self, host: HostSpec) -> bool:
        result = self.results.get(host.name)
        return result is not None and bool(result.from_release)

    def _scrape(self, hosts: list[HostSpec]) -> dict[str, str]:
        return {h.name: self.session(h).metrics() for h in hosts}

    def _hold_and_gate(self, step: TrafficStep, new: list[HostSpec], old: list[HostSpec]) -> None:
        """Hold the step over the gate's window and judge the new release's series against the
        stack's limits and the old release's series over the same window."""
        gate = StepGate(self.settings.rollout.gate, self._scrape, self.excluded_routes, self.report)
        # A host with no release yet has no series.
        verdict = gate.hold(step, lambda: (new, [h for h in old if self._serves(h)]))
        if verdict:
            raise FrontierError(f"traffic step {step.percent} %: {verdict}")

    def _invariant(self, after: str) -> int:
        """How many replicas are routable after a step; fewer than the floor raises RoutableLost."""
        names = self.weights.routable(self.hosts)
        detail = f"{len(names)} routable ({', '.join(names) or 'none'}) after {after}"
        self.report(Event("-", "routable", "ok" if len(names) >= ROUTABLE_FLOOR else "fail", detail))
        if len(names) < ROUTABLE_FLOOR:
            raise RoutableLost(f"{detail}: a rollout keeps at least {ROUTABLE_FLOOR} replica routable")
        return len(names)

    def _revert(
        self,
        touched: list[HostSpec],
        results: dict[str, HostResult],
        new: list[HostSpec],
        old: list[HostSpec],
    ) -> bool:
        """All traffic back on the hosts still on the old release, then every touched host back to
        the release it ran, then even weights; True when every touched host is back."""
        if not self.shifted:
            return self._restore(touched, results)
        still_old = [h for h in old if h not in touched]
        with contextlib.suppress(Exception):  # a balancer that fails here leaves the restore to try
            if still_old:
                self.weights.split([h for h in self.hosts if h not in still_old], still_old, 0)
                self._reverted("all traffic back on the old release")
            else:
                self.weights.even(self.hosts)
        all_back = self._restore(touched, results)
        with contextlib.suppress(Exception):
            self.weights.even(self.hosts)
            self._reverted("the revert's weights even again")
        return all_back

    def _reverted(self, after: str) -> None:
        """The invariant during a revert: where a step left nothing routable, every host that passes
        its health check takes traffic again, whichever release it runs."""
        try:
            self._invariant(after)
        except RoutableLost:
            self.weights.even(self.hosts)
