"""The local stack's autoscaler: target tracking on the runtimes' queue depth, fed from ``/metrics``.

The cloud's node group scales on the ``QueueDepth`` metric each host publishes (a target-tracking
policy, see :mod:`infra.nodes`; it scales in by :mod:`infra.scale_in`'s rule, the one below); KEDA does the same on ``vllm:num_requests_waiting`` in vLLM's
production stack. Here nothing stands between the runtimes and the decision: every ``interval_s``
the autoscaler scrapes each in-service slot's ``/metrics`` and feeds a :class:`Decider`:

* **out**: requests waiting per host above ``target_queue_depth`` for ``scale_out_after_s`` →
  ``ceil(waiting / target)`` hosts (target tracking's proportional step), at least one more,
  at most ``max_size``; each new slot bootstraps the current release itself (:meth:`LocalFleet.launch`).
* **in**: for ``scale_in_after_s`` nothing waited *and* what runs would fit on one host fewer at
  ``scale_in_utilisation`` of their concurrency → one host fewer, never below ``min_size``, drained
  first (:meth:`LocalFleet.retire`). A queue that is merely empty is not enough: under a steady load
  that one host fewer could not carry, scaling in would only start the queue again (flapping).
* **out on latency**: the runtimes' TTFT p90 between two scrapes (their histograms' buckets,
  summed over the hosts) above the stack's ``slo.ttft_ms`` for ``scale_out_after_s`` → one host
  more, whatever the queue: long prompts can slow first tokens while few requests wait. The EC2
  group's step policy and KEDA's ``ttft-p90`` trigger do the same on their side.
* after any change, ``cooldown_s`` of observation is thrown away before the next decision.
* **from zero**: a group at zero hosts (``min_size: 0``) with requests held by the gateway for its
  model (``frontier_gateway_pool_waiting{pool}`` on the gateway's admin ``/metrics``: the demand
  signal) launches one host at once — no delay, no cooldown: every second is a held client's.
* **to zero**: with ``idle_to_zero_s`` set, a group whose hosts ran nothing, queued nothing, and
  whose model got no request through the gateway (its request counter did not move) for that long
  retires every host. The gateway holds what comes next.
* **schedule**: inside a window of the group's ``schedule`` the floor is the window's ``min_size``:
  fewer hosts than that scale out to it at once (after any cooldown), and nothing scales in below it
  or to zero. The forecast (a predictive policy on EC2) is not applied here: the local stack keeps
  no day of history to learn from.

The decision is a pure function of the observations and the clock, tested on its own; the loop
around it (:class:`Autoscaler`) scrapes, decides and acts.
"""

from __future__ import annotations

import math
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from frontier_gateway.hold import POOL_LABEL, POOL_WAITING_METRIC
from frontier_hostside.names import (
    GATEWAY_MODEL_LABEL,
    GATEWAY_REQUESTS_METRIC,
    METRICS_PATH,
    RUNNING_METRIC,
    TTFT_METRIC,
    WAITING_METRIC,
)
from prometheus_client.parser import text_string_to_metric_families

from frontier.config.schedule import Schedule
from frontier.config.schema import Local, LocalAutoscaler, PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.hosts.inventory import HostSpec
from frontier.targets.local.group import LocalFleet


@dataclass(frozen=True)
class Observation:
    """One scrape of every in-service host."""

    at: float
    hosts: int
    waiting: float
    running: float
    unreachable: int = 0
    # From the gateway (None where the stack has none, or it did not answer): requests held for a
    # replica of this pool, and how many of its requests the gateway has answered so far.
    held: float | None = None
    answered: float | None = None
    wall: float = 0.0  # unix time of the scrape, for the schedule's windows (0: not known)
    # The hosts' TTFT p90 (ms) over the requests that got a first token since the last scrape;
    # None where none did (or a host did not answer).
    ttft_p90_ms: float | None = None

    @property
    def waiting_per_host(self) -> float:
        return self.waiting / self.hosts if self.hosts else 0.0


@dataclass(frozen=True)
class Decision:
    at: float
    current: int
    desired: int
    reason: str

    @property
    def direction(self) -> str:
        return "out" if self.desired > self.current else "in"


@dataclass(frozen=True)
class Policy:
    target_queue_depth: float
    min_size: int
    max_size: int
    max_concurrency: int
    scale_in_utilisation: float
    timing: LocalAutoscaler
    idle_to_zero_s: float | None = None
    schedule: Schedule | None = None
    # The stack's slo.ttft_ms: a TTFT p90 above it scales out like a queue over target. None: off.
    ttft_scale_out_ms: float | None = None

    def floor_at(self, wall: float) -> int:
        """The group's floor at unix time ``wall``: ``min_size``, raised inside a schedule window."""
        if self.schedule is None or not wall:
            return self.min_size
        window = self.schedule.floor_at(datetime.fromtimestamp(wall, UTC))
        return self.min_size if window is None else max(self.min_size, window)

    @classmethod
    def of(cls, settings: Settings, pool: PoolSettings) -> Policy:
        """The policy of ``pool``'s group: its node group's bounds and targets, its runtime's concurrency."""
        group = pool.group
        return cls(
            group.target_queue_depth,
            group.min_size,
            group.max_size,
            pool.runtime.max_concurrency,
            group.scale_in_utilisation,
            settings.section(Local).autoscaler,
            group.idle_to_zero_s,
            group.schedule,
            settings.slo.ttft_ms,
        )


class Decider:
    """When to scale, from a stream of observations (no I/O: the clock is the observations')."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._over_since: float | None = None
        self._slow_since: float | None = None
        self._calm_since: float | None = None
        self._idle_since: float | None = None
        self._last_answered: float | None = None
        self._quiet_until = -math.inf

    def changed(self, at: float) -> None:
        """A change was made at ``at``: start over after the cooldown."""
        self._over_since = self._slow_since = self._calm_since = self._idle_since = None
        self._quiet_until = at + self.policy.timing.cooldown_s

    def feed(self, seen: Observation) -> Decision | None:
        p, t = self.policy, self.policy.timing
        floor = p.floor_at(seen.wall)
        if seen.hosts < floor and seen.at >= self._quiet_until:
            # A schedule window raised the floor: capacity goes in before the peak, not after a queue.
            return Decision(
                seen.at, seen.hosts, min(floor, p.max_size), f"a schedule window raises the floor to {floor}"
            )
        if seen.hosts == 0:
            return self._from_zero(seen)
        to_zero = self._to_zero(seen)
        if to_zero is not None:
            return to_zero
        if seen.at < self._quiet_until or seen.hosts == 0 or seen.unreachable:
            # A host that does not answer is starting or going: its queue is not known yet.
            self._over_since = self._slow_since = self._calm_since = None
            return None
        over = seen.waiting_per_host > p.target_queue_depth
        fits_on_fewer = (
            seen.hosts > 1 and seen.running <= (seen.hosts - 1) * p.max_concurrency * p.scale_in_utilisation
        )
        calm = seen.waiting == 0 and fits_on_fewer
        self._over_since = (self._over_since if self._over_since is not None else seen.at) if over else None
        self._calm_since = (self._calm_since if self._calm_since is not None else seen.at) if calm else None
        if over and seen.at - self._over_since >= t.scale_out_after_s and seen.hosts < p.max_size:
            desired = min(p.max_size, max(seen.hosts + 1, math.ceil(seen.waiting / p.target_queue_depth)))
            return Decision(
                seen.at,
                seen.hosts,
                desired,
                f"{seen.waiting_per_host:.1f} waiting per host > target {p.target_queue_depth:g} "
                f"for {seen.at - self._over_since:.0f}s",
            )
        slow = (
            p.ttft_scale_out_ms is not None
            and seen.ttft_p90_ms is not None
            and seen.ttft_p90_ms > p.ttft_scale_out_ms
        )
        self._slow_since = (self._slow_since if self._slow_since is not None else seen.at) if slow else None
        if slow and seen.at - self._slow_since >= t.scale_out_after_s and seen.hosts < p.max_size:
            return Decision(
                seen.at,
                seen.hosts,
                seen.hosts + 1,
                f"TTFT p90 {seen.ttft_p90_ms:,.0f} ms > slo.ttft_ms {p.ttft_scale_out_ms:g} "
                f"for {seen.at - self._slow_since:.0f}s",
            )
        if calm and not slow and seen.at - self._calm_since >= t.scale_in_after_s and seen.hosts > floor:
            return Decision(
                seen.at,
                seen.hosts,
                seen.hosts - 1,
                f"nothing waiting and {seen.running:.0f} running (fits {seen.hosts - 1} host(s) at "
                f"{p.scale_in_utilisation:.0%}) for {seen.at - self._calm_since:.0f}s",
            )
        return None

    def _from_zero(self, seen: Observation) -> Decision | None:
        # Demand at zero is acted on at once: the cooldown protects hosts that serve, and none does.
        self._over_since = self._calm_since = self._idle_since = None
        if seen.held and self.policy.max_size >= 1:
            return Decision(
                seen.at, 0, 1, f"{seen.held:.0f} request(s) held by the gateway for a pool at zero"
            )
        return None

    def _to_zero(self, seen: Observation) -> Decision | None:
        """All hosts go when nothing ran, waited or arrived for ``idle_to_zero_s``."""
        p = self.policy
        arrived = seen.answered is not None and seen.answered != self._last_answered
        self._last_answered = seen.answered
        if (
            p.floor_at(seen.wall) > 0
            or p.idle_to_zero_s is None
            or seen.at < self._quiet_until
            or seen.unreachable
        ):
            self._idle_since = None
            return None
        idle = seen.waiting == 0 and seen.running == 0 and not seen.held and not arrived
        if not idle:
            self._idle_since = None
            return None
        if self._idle_since is None:
            self._idle_since = seen.at
        if seen.at - self._idle_since < p.idle_to_zero_s:
            return None
        return Decision(
            seen.at,
            seen.hosts,
            0,
            f"nothing ran, waited or arrived for {seen.at - self._idle_since:.0f}s "
            f"(idle_to_zero_s {p.idle_to_zero_s:g})",
        )


def scrape_gateway(url: str, pool: str, timeout: float = 2.0) -> tuple[float, float] | None:
    """(held, answered) for ``pool`` from the gateway's admin /metrics; None when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    held = answered = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == POOL_WAITING_METRIC and sample.labels.get(POOL_LABEL) == pool:
                held += sample.value
            elif (
                sample.name == f"{GATEWAY_REQUESTS_METRIC}_total"
                and sample.labels.get(GATEWAY_MODEL_LABEL) == pool
            ):
                answered += sample.value
    return held, answered


@dataclass(frozen=True)
class HostScrape:
    """One runtime's /metrics: its queue, what it runs, and its TTFT histogram's cumulative
    bucket counts by upper bound (seconds)."""

    waiting: float
    running: float
    ttft_buckets: dict[float, float]


def scrape(host: HostSpec, port: int, timeout: float = 2.0) -> HostScrape | None:
    """A runtime's /metrics; None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{host.address}:{port}{METRICS_PATH}", timeout=timeout) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    values = {WAITING_METRIC: 0.0, RUNNING_METRIC: 0.0}
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in values:
                values[sample.name] += sample.value
            elif sample.name == f"{TTFT_METRIC}_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return HostScrape(values[WAITING_METRIC], values[RUNNING_METRIC], buckets)


def bucket_p90_ms(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The p90 (ms) of the observations a cumulative histogram gained between two readings, as
    Prometheus's histogram_quantile takes it: linear within the bucket it falls in. None when
    nothing was observed or the counts fell (a runtime restarted)."""
    bounds = sorted(after)
    gained = [after[b] - before.get(b, 0.0) for b in bounds]
    if not gained or gained[-1] <= 0 or any(g < 0 for g in gained):
        return None
    rank = 0.9 * gained[-1]
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, gained, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower * 1000  # past the last finite bound: its bound is all that is known
            inside = count - below
            return (lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)) * 1000
        lower, below = bound, count
    return None


class Autoscaler:
    """Scrape, decide, act; in the foreground (``run``) or a thread (``start``/``stop``). It scales
    ``fleet``, the group of one pool (``fleet.pool``), on that pool's runtimes and gateway demand."""

    def __init__(
        self,
        settings: Settings,
        fleet: LocalFleet,
        *,
        on_observation: Callable[[Observation], None] | None = None,
        on_decision: Callable[[Decision, str], None] | None = None,
        gateway_metrics_url: str | None = None,
    ) -> None:
        """``gateway_metrics_url``: the gateway's admin /metrics, where held requests show (default:
        the stack's gateway.admin_host:admin_port; none without a gateway section)."""
        self.settings = settings
        gateway = settings.gateway
        if gateway_metrics_url is None and gateway is not None:
            gateway_metrics_url = f"http://{gateway.admin_host}:{gateway.admin_port}{METRICS_PATH}"
        self.gateway_metrics_url = gateway_metrics_url
        self.fleet = fleet
        self.pool = fleet.pool
        self.decider = Decider(Policy.of(settings, self.pool))
        self.on_observation = on_observation or (lambda _seen: None)
        self.on_decision = on_decision or (lambda _decision, _outcome: None)
        self.decisions: list[tuple[Decision, str]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ttft_before: dict[float, float] | None = None

    def observe(self) -> Observation:
        hosts = self.fleet.serving()
        scraped = [scrape(h, self.pool.runtime.port) for h in hosts]
        answered = [s for s in scraped if s is not None]
        ttft = self._ttft_p90(answered if len(answered) == len(scraped) else None)
        demand = None
        if self.gateway_metrics_url is not None:
            demand = scrape_gateway(self.gateway_metrics_url, self.pool.name)
        return Observation(
            wall=time.time(),
            at=time.monotonic(),
            hosts=len(hosts),
            waiting=sum(s.waiting for s in answered),
            running=sum(s.running for s in answered),
            unreachable=len(scraped) - len(answered),
            held=None if demand is None else demand[0],
            answered=None if demand is None else demand[1],
            ttft_p90_ms=ttft,
        )

    def _ttft_p90(self, scrapes: list[HostScrape] | None) -> float | None:
        """The TTFT p90 since the last scrape, over every host's histogram; None (and no reading
        kept) when a host did not answer, as a sum over some hosts would not be the pool's."""
        if scrapes is None:
            self._ttft_before = None
            return None
        summed: dict[float, float] = {}
        for s in scrapes:
            for bound, count in s.ttft_buckets.items():
                summed[bound] = summed.get(bound, 0.0) + count
        before, self._ttft_before = self._ttft_before, summed
        return None if before is None else bucket_p90_ms(before, summed)

    def step(self) -> Decision | None:
        seen = self.observe()
        self.on_observation(seen)
        decision = self.decider.feed(seen)
        if decision is None:
            return None
        try:
            after = self.fleet.scale(decision.desired)
            outcome = f"now {after.desired} in service"
        except FrontierError as exc:
            outcome = f"failed: {exc}"
        self.decider.changed(time.monotonic())
        self.decisions.append((decision, outcome))
        self.on_decision(decision, outcome)
        return decision

    def run(self, duration_s: float | None = None) -> None:
        deadline = math.inf if duration_s is None else time.monotonic() + duration_s
        interval = self.settings.local.autoscaler.interval_s if self.settings.local else 1.0
        while not self._stop.is_set() and time.monotonic() < deadline:
            self.step()
            self._stop.wait(interval)

    def start(self) -> Autoscaler:
        self._thread = threading.Thread(target=self.run, name="local-autoscaler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
