"""The rolling deploy: canary first, then batches; drain, stop, swap, start, readiness, enable, gate.

Every host goes through the same path, and so does every way back: when any step on any host
fails, the rollout stops there and returns every host it touched (the failing one included) to
the release it ran before, through the same drain → stop → swap → start → readiness → enable
steps. Hosts are visited by our own loop, never a Fabric group, so the first failure stops it.

Staging (upload + install) happens while a host still serves, so a host is out of rotation only
from drain to enable.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from frontier.config.schema import PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.hosts.balancer import Balancer
from frontier.hosts.inventory import HostSpec
from frontier.hosts.session import HostError, HostFacts, HostSession
from frontier.release.release import Release
from frontier.rollout.canary import CanaryVerification, judge_verification, verify_through
from frontier.rollout.gate import judge, judge_relative, read_gate


class RolloutFailed(FrontierError):
    """A deploy or rollback that stopped; the result says what was restored."""

    def __init__(self, result: RolloutResult) -> None:
        super().__init__(
            f"{result.kind} of {result.release} {result.outcome.replace('_', ' ')}: {result.reason}"
        )
        self.result = result


@dataclass(frozen=True)
class Event:
    host: str
    phase: str
    status: str  # start | ok | fail | info
    detail: str = ""
    elapsed_s: float = 0.0


Reporter = Callable[[Event], None]


@dataclass
class HostResult:
    name: str
    from_release: str = ""
    to_release: str = ""
    outcome: str = "pending"  # pending | skipped | updated | restored | failed | untouched | retired
    phases: dict[str, float] = field(default_factory=dict)
    error: str = ""

    @property
    def out_of_service_s(self) -> float:
        return sum(self.phases.get(p, 0.0) for p in ("drain", "stop", "start", "readiness", "enable"))

    def to_record(self) -> dict[str, Any]:
        """This host's entry in the stack's deploy history (the JSON format history readers expect)."""
        return {
            "name": self.name,
            "from": self.from_release,
            "to": self.to_release,
            "outcome": self.outcome,
            "error": self.error,
            "phases": self.phases,
            "out_of_service_s": round(self.out_of_service_s, 3),
        }


@dataclass
class RolloutResult:
    kind: str
    release: str
    outcome: str = "succeeded"  # succeeded | rolled_back | failed
    reason: str = ""
    hosts: list[HostResult] = field(default_factory=list)
    duration_s: float = 0.0
    #: How capacity was kept: surge or one-unavailable, and why (see frontier.rollout.strategy).
    strategy: str = ""
    #: A traffic-weighted rollout's steps, as far as it went (frontier.rollout.weighted).
    steps: list[TrafficStep] = field(default_factory=list)


@dataclass
class TrafficStep:
    """One step of a traffic-weighted rollout: the new release's share, what each release served
    while it held, how many replicas the balancer could route to, and its verdict."""

    percent: int
    outcome: str = "pending"  # pending | passed | failed
    new: str = ""
    old: str = ""
    routable: int = 0
    reason: str = ""
    #: The share the new release took where the target carries it in whole replicas (asked: ``percent``).
    realised: float | None = None

    def to_record(self) -> dict[str, Any]:
        return {
            "percent": self.percent,
            "realised": self.realised,
            "outcome": self.outcome,
            "new": self.new,
            "old": self.old,
            "routable": self.routable,
            "reason": self.reason,
        }


# --- the rollout ----------------------------------------------------------------------------------


def waves(hosts: list[HostSpec], canary: int, batch: int) -> Iterator[tuple[str, list[HostSpec]]]:
    """Canary host(s) first, then batches of ``batch`` hosts."""
    canary = min(canary, len(hosts))
    if canary:
        yield "canary", hosts[:canary]
    rest = hosts[canary:]
    for i in range(0, len(rest), batch):
        yield f"batch {i // batch + 1}", rest[i : i + batch]


class Rollout:
    """Rolls one release over the hosts of a stack's pool; restores every touched host on failure."""

    def __init__(
        self,
        settings: Settings,
        pool: PoolSettings,
        hosts: list[HostSpec],
        balancer: Balancer,
        connect: Callable[[HostSpec], Any],
        reporter: Reporter | None = None,
        verification: CanaryVerification | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.hosts = hosts
        self.balancer = balancer
        self.connect = connect
        self.report = reporter or (lambda event: None)
        self.verification = verification
        #: Hosts outside this rollout that may still serve the old release (a surge wave's are new):
        #: the canary's yardstick may be one of them.
        self.peers: list[HostSpec] = []
        self.sessions: dict[str, HostSession] = {}
        health = settings.health
        self.excluded_routes = {health.readiness_path, health.liveness_path, "/metrics"}
        self.enable_timeout = health.interval_s * (health.healthy_threshold + 2) + health.timeout_s + 10
        self.drain_timeout = float(settings.rollout.deregistration_delay_s)

    def session(self, host: HostSpec) -> HostSession:
        if host.name not in self.sessions:
            self.sessions[host.name] = HostSession(self.settings, self.pool, host, self.connect(host))
        return self.sessions[host.name]

    def close(self) -> None:
        for session in self.sessions.values():
            # Closing a dead connection must not hide the real error.
            with contextlib.suppress(Exception):
                session.close()
        self.sessions.clear()

    def _phase(self, result: HostResult, phase: str, fn: Callable[[], Any]) -> Any:
        self.report(Event(result.name, phase, "start"))
        start = time.monotonic()
        try:
            value = fn()
        except Exception as exc:
            elapsed = time.monotonic() - start
            result.phases[phase] = round(elapsed, 3)
            self.report(Event(result.name, phase, "fail", str(exc), elapsed))
            raise
        elapsed = time.monotonic() - start
        result.phases[phase] = round(result.phases.get(phase, 0.0) + elapsed, 3)
        self.report(Event(result.name, phase, "ok", value if isinstance(value, str) else "", elapsed))
        return value

    # --- one wave: every host of it through each phase ---------------------------------------------

    def _switch(
        self,
        wave: list[HostSpec],
        results: dict[str, HostResult],
        target: dict[str, str],
        touched: list[HostSpec] | None = None,
    ) -> None:
        """Drain → stop → swap + start → readiness → enable, for every host of the wave.

        A host counts as touched (and is restored on failure) from the moment its drain begins.
        """
        rollout = self.settings.rollout
        for host in wave:
            if touched is not None and host not in touched:
                touched.append(host)
            left = self._phase(
                results[host.name], "drain", partial(self.balancer.drain, host, self.drain_timeout)
            )
            if left != 0:
                open_sessions = "an unknown number of" if left is None else str(left)
                self.report(
                    Event(
                        host.name,
                        "drain",
                        "info",
                        f"{open_sessions} session(s) still open after {self.drain_timeout:.0f}s",
                    )
                )
        # Stops run together: each waits out its runtime's drain, and the hosts are already out of rotation.
        self._concurrently(wave, results, "stop", lambda h: self.session(h).stop())
        for host in wave:
            rid = target[host.name]
            self._phase(
                results[host.name],
                "start",
                partial(lambda h, r: self.session(h).activate_and_start(r), host, rid),
            )
        for host in wave:
            self._phase(
                results[host.name],
                "readiness",
                partial(lambda h: self.session(h).wait_ready(rollout.readiness_timeout_s), host),
            )
        for host in wave:
            self._phase(
                results[host.name], "enable", partial(self.balancer.enable, host, self.enable_timeout)
            )

    def _concurrently(
        self, wave: list[HostSpec], results: dict[str, HostResult], phase: str, fn: Callable[[HostSpec], Any]
    ) -> None:
        """One phase on every host of the wave at once (each host has its own connection)."""
        if len(wave) == 1:
            self._phase(results[wave[0].name], phase, lambda: fn(wave[0]))
            return
        for host in wave:
            self.session(host)  # connections are opened here, not from the worker threads
        with ThreadPoolExecutor(max_workers=len(wave)) as pool:
            futures = [pool.submit(self._phase, results[h.name], phase, partial(fn, h)) for h in wave]
        errors = [error for f in futures if (error := f.exception()) is not None]
        if errors:
            raise errors[0]

    def _gate(self, wave: list[HostSpec], results: dict[str, HostResult], old: HostSpec | None) -> None:
        """Each host of the wave over the window against the stack's limits, and, with
        ``rollout.gate.max_p99_ratio``, against ``old`` (a host on the old release) over the same window."""
        gate = self.settings.rollout.gate
        if gate.window_s <= 0:
            for host in wave:
                self.report(Event(host.name, "gate", "info", "skipped: rollout.gate.window_s is 0"))
            return
        compare = old if gate.max_p99_ratio is not None else None
        before: dict[str, str] = {}
        for host in wave:

            def baseline(h: HostSpec = host) -> str:
                before[h.name] = self.session(h).metrics()
                return f"watching {gate.window_s:g}s"

            self._phase(results[host.name], "gate", baseline)
        if compare is not None:
            before[compare.name] = self.session(compare).metrics()
        time.sleep(gate.window_s)
        old_reading = None
        if compare is not None:
            old_reading = read_gate(
                before[compare.name], self.session(compare).metrics(), self.excluded_routes
            )
        for host in wave:

            def check(h: HostSpec = host) -> str:
                reading = read_gate(before[h.name], self.session(h).metrics(), self.excluded_routes)
                verdict = judge(reading, gate) or (
                    judge_relative(reading, old_reading, gate) if old_reading is not None else None
                )
                if verdict:
                    raise HostError(h.name, "gate", verdict)
                against = (
                    "" if old_reading is None else f"; old release on {compare}: {old_reading.describe()}"
                )
                return reading.describe() + against

            self._phase(results[host.name], "gate", check)

    def _verify(self, wave: list[HostSpec], results: dict[str, HostResult], old: HostSpec | None) -> None:
        """The verification set on each canary host, judged against ``old`` (a host on the old release)."""
        check = self.verification
        if check is None:
            return
        old_report = None
        if old is not None and check.unrecorded and check.store is not None:
            # Nothing recorded yet: the release the canary replaces is the reference.
            reference = self.session(old).facts().current
            check = check.recorded_from(reference, self.session(old).conn, old.address)
            self.verification = check
            self.report(Event(old.name, "verify", "info", f"golden outputs recorded from {reference}"))
        if old is not None:
            old_report = verify_through(self.session(old).conn, old.address, check)
            self.report(
                Event(
                    old.name,
                    "verify",
                    "info",
                    f"old release: {old_report.passed}/{len(old_report.results)} passed",
                )
            )
        for host in wave:

            def run(h: HostSpec = host) -> str:
                report = verify_through(self.session(h).conn, h.address, check)
                verdict = judge_verification(report, old_report, check)
                if verdict:
                    raise HostError(h.name, "verify", verdict)
                return f"{report.passed}/{len(report.results)} cases passed ({report.pass_rate:.1%})"

            self._phase(results[host.name], "verify", run)

    def _old_host(self, release_id: str, exclude: list[HostSpec]) -> HostSpec | None:
        """A host not in ``exclude`` that serves a release other than ``release_id``, if any."""
        for host in self.hosts + [p for p in self.peers if p not in self.hosts]:
            if host in exclude:
                continue
            facts = self.session(host).facts()
            if facts.current and facts.current != release_id:
                return host
        return None

    def run(self, release: Release, wheel: Any, kind: str = "deploy") -> RolloutResult:
        started = time.monotonic()
        result = RolloutResult(kind=kind, release=release.id)
        results = {h.name: HostResult(h.name, to_release=release.id) for h in self.hosts}
        result.hosts = list(results.values())
        touched: list[HostSpec] = []
        try:
            rollout = self.settings.rollout
            for wave_name, wave in waves(self.hosts, rollout.canary_hosts, rollout.batch_size):
                self.report(Event(",".join(h.name for h in wave), wave_name, "info"))
                todo = self._check_and_stage(release, wheel, results, wave)
                if not todo:
                    continue
                self._switch(todo, results, {h.name: release.id for h in todo}, touched)
                canary = wave_name == "canary"
                wants_old = canary and (
                    self.verification is not None or rollout.gate.max_p99_ratio is not None
                )
                old = self._old_host(release.id, touched) if wants_old else None
                self._gate(todo, results, old)
                if canary:
                    self._verify(todo, results, old)
                self._updated(todo, results)
        except (Exception, KeyboardInterrupt) as exc:  # any failure, ours, the network's or Ctrl-C, stops it
            self._stopped(result, exc)
            result.outcome = "rolled_back" if self._restore(touched, results) else "failed"
        finally:
            result.duration_s = round(time.monotonic() - started, 3)
            self.close()
        return result

    def _check_and_stage(
        self,
        release: Release,
        wheel: Any,
        results: dict[str, HostResult],
        hosts: list[HostSpec] | None = None,
    ) -> list[HostSpec]:
        """The rollout's hosts (or ``hosts`` of them, a wave) not yet on ``release``, with it staged
        on each while they still serve."""
        todo = []
        for host in self.hosts if hosts is None else hosts:
            res = results[host.name]
            facts: HostFacts = self._phase(
                res, "check", partial(lambda h: self.session(h).facts(release.id), host)
            )
            res.from_release = facts.current
            if facts.runs(release.id):
                res.outcome = "skipped"
                self.report(Event(host.name, "check", "info", f"already runs {release.id}"))
                continue
            self._phase(res, "stage", partial(self._stage, host, release, wheel))
            todo.append(host)
        return todo

    def _stage(self, host: HostSpec, release: Release, wheel: Any) -> str:
        return "staged" if self.session(host).stage(release, wheel) else "already staged"

    def _updated(self, hosts: list[HostSpec], results: dict[str, HostResult]) -> None:
        """``hosts`` are on the release: each is updated, then the releases it keeps are pruned."""
        for host in hosts:
            results[host.name].outcome = "updated"
            # A release left on disk is not worth failing a good rollout for.
            with contextlib.suppress(FrontierError):
                self._phase(results[host.name], "prune", partial(self._prune, host))

    def _prune(self, host: HostSpec) -> str:
        return str(self.session(host).prune(self.settings.rollout.keep_releases))

    @staticmethod
    def _stopped(result: RolloutResult, exc: BaseException) -> None:
        """Why the rollout stopped, on ``result`` and on the host whose phase failed (if one did)."""
        if isinstance(exc, KeyboardInterrupt):
            result.reason = "interrupted by the operator"
        elif isinstance(exc, FrontierError):
            result.reason = str(exc)
        else:
            result.reason = f"{type(exc).__name__}: {exc}"
        failing = next((r for r in result.hosts if r.outcome == "pending" and r.phases), None)
        if failing is not None:
            failing.error = result.reason

    def _restore(self, touched: list[HostSpec], results: dict[str, HostResult]) -> bool:
        """Return every touched host to the release it ran before; True when all of them are back.

        A replica over N nodes goes back as one unit (its N hosts in the order the rollout took
        them, whole replicas): its nodes must never run two releases, or its leader would refuse
        the others."""
        all_back = True
        restorable = []
        for host in touched:
            res = results[host.name]
            if res.from_release:
                restorable.append(host)
                continue
            # A host with nothing before: keep it out of rotation rather than serve a bad release.
            try:
                self._phase(res, "restore", self.session(host).stop)
            except Exception as exc:  # noqa: BLE001
                res.error = res.error or str(exc)
            res.outcome = "failed"
            all_back = False
        size = self.pool.runtime.nodes_per_replica
        for unit in (restorable[i : i + size] for i in range(0, len(restorable), size)):
            try:
                for host in unit:
                    self.report(
                        Event(host.name, "restore", "info", f"back to {results[host.name].from_release}")
                    )
                    # A fresh connection: the old one may be what broke.
                    old = self.sessions.pop(host.name, None)
                    if old is not None:
                        old.close()
                self._switch(unit, results, {h.name: results[h.name].from_release for h in unit})
                for host in unit:
                    results[host.name].outcome = "restored"
            except Exception as exc:  # noqa: BLE001 - keep restoring the others
                all_back = False
                for host in unit:
                    res = results[host.name]
                    res.outcome = "failed"
                    res.error = res.error or str(exc)
                    with contextlib.suppress(Exception):
                        self.balancer.enable(host, 1.0)  # let the balancer's health check decide
        for res in results.values():
            if res.outcome == "pending":
                res.outcome = "untouched"
        return all_back
