"""The local stack's alarms: CloudWatch's part, played on this machine.

A service of the local stack (``local.up`` starts it, ``local.down`` stops it) that every
``alerts.evaluation_interval_s``:

* reads each in-service host slot's runtime process from ``/proc`` — CPU seconds (user, system) and
  resident memory — and publishes them to moto's CloudWatch under the names the CloudWatch agent
  uses on EC2 (``procstat_cpu_time_user``, ``procstat_cpu_time_system``, ``procstat_memory_rss`` in
  the runtime's namespace, dimensions Stack, NodeGroup and Host);
* evaluates the named alarms of every target (:mod:`frontier.alarms`), one watch each
  (:data:`LOCAL_WATCHES`): ``runtime-down`` per slot (the slot serves a release, the balancer has not
  taken it out for a rollout, maintenance or drain, and its runtime has not answered its readiness
  check for ``alerts.runtime_down_for_s``; it recovers once the runtime answers again); ``ttft``,
  ``kv-cache-full`` and ``structured-output-failures`` per slot, each its declaration's measure of
  the runtime's /metrics since the last round against its threshold; ``runtime-restarts`` per slot,
  its supervisor's restarts of the runtime within the window (``run/supervisor.json``); ``probe-failing``: every
  minute, once a slot serves a release, the synthetic probe (``frontier_hostside/probe.py``) sends
  its fixed request through the stack's endpoint (the balancer, or the gateway), publishes ``ProbeSuccess`` and ``ProbeLatency``
  to moto's CloudWatch as the EC2 probe does, and fires after the declared minutes of failures;
* publishes each change of state (ALARM, OK) to the SNS topic of the alarm's severity in moto,
  as CloudWatch does: the stack's ``alerts.routes`` are that topic's subscriptions (an SQS queue in
  moto receives them; e-mail is subscribed but moto sends no mail).

Messages carry CloudWatch's alarm fields (``AlarmName``, ``NewStateValue``, ``OldStateValue``,
``NewStateReason``, ``StateChangeTime``, ``Region``) plus the host slot (``Host``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from frontier_hostside import probe
from frontier_hostside.names import CLOUDWATCH_DIMENSIONS, CURRENT_LINK, METRICS_PATH, SUPERVISOR_STATE_NAME
from frontier_hostside.node_boot import parse_prometheus

from frontier.alarms import (
    NAMED_ALARMS,
    PROBE_FAILED_MINUTES,
    PROBE_INTERVAL_S,
    PROBE_TIMEOUT_S,
    RESTARTS_ALLOWED,
    RESTARTS_WINDOW_S,
    ProbeFailing,
    RuntimeMetricAlarm,
    RuntimeRestarts,
    Samples,
)
from frontier.alarms import RuntimeDown as RuntimeDownAlarm
from frontier.config.load import read_stack
from frontier.config.schema import SEVERITIES, PoolSettings, Settings, Severity
from frontier.errors import FrontierError
from frontier.hosts.inventory import HostSpec
from frontier.render.alerts import HOST_DIMENSION, HOST_NAMESPACE, PROC_CPU_SYSTEM, PROC_CPU_USER, PROC_RSS
from frontier.targets.local import cluster
from frontier.targets.local.backend import LocalBackend, slots_in_service
from frontier.targets.local.heal import ready, runtime_pid, runtime_url

RUNTIME_DOWN = RuntimeDownAlarm.name
RUNTIME_RESTARTS = RuntimeRestarts.name
PROBE_FAILING = ProbeFailing.name
# The probe's figures are the stack's, not a slot's.
ENDPOINT = "endpoint"
# The balancer's states in which a rollout (not a failure) holds a host out of rotation.
TAKEN_OUT = ("MAINT", "DRAIN")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def alarm_name(settings: Settings, alarm: str) -> str:
    """The name CloudWatch gives the alarm on a cloud stack: ``frontier-<stack>-<alarm>``."""
    return f"frontier-{settings.stack}-{alarm}"


def topic_name(settings: Settings, severity: Severity) -> str:
    return f"frontier-{settings.stack}-{severity}"


# --- the runtime process, from /proc --------------------------------------------------------------


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    cpu_user_s: float
    cpu_system_s: float
    rss_bytes: int


def process_usage(pid: int, proc: Path = Path("/proc")) -> ProcessUsage:
    """CPU seconds and resident memory of ``pid``, read from ``/proc/<pid>/stat`` (no psutil needed)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError as exc:
        raise FrontierError(f"pid {pid}: no such process ({exc.strerror})") from None
    # The command name (field 2) is in parentheses and may hold spaces: split after its last ")".
    fields = text[text.rindex(")") + 2 :].split()
    # Fields 14, 15 (utime, stime; clock ticks) and 24 (rss; pages), counted from 1 with the name at 2.
    utime, stime, rss = int(fields[11]), int(fields[12]), int(fields[21])
    return ProcessUsage(pid, utime / CLOCK_TICKS, stime / CLOCK_TICKS, rss * PAGE_SIZE)


# --- evaluation -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    """One alarm of one host slot changing state."""

    alarm: str
    severity: Severity
    host: str
    old: str  # OK | ALARM
    new: str
    reason: str
    at: float  # seconds since the epoch

    def message(self, settings: Settings) -> dict[str, Any]:
        return {
            "AlarmName": alarm_name(settings, self.alarm),
            "AlarmDescription": f"{self.alarm} ({self.severity}) on stack {settings.stack}",
            "NewStateValue": self.new,
            "OldStateValue": self.old,
            "NewStateReason": self.reason,
            "StateChangeTime": datetime.fromtimestamp(self.at, UTC).isoformat(timespec="milliseconds"),
            "Region": settings.region,
            "Severity": self.severity,
            "Host": self.host,
        }

    def subject(self, settings: Settings) -> str:
        return f"{self.new}: {alarm_name(settings, self.alarm)} on {self.host}"


@dataclass
class RuntimeDown:
    """``runtime-down`` of every host slot: not ready for ``after_s`` -> ALARM; ready again -> OK."""

    severity: Severity
    after_s: float
    unready_since: dict[str, float] = field(default_factory=dict)
    alarming: set[str] = field(default_factory=set)

    def observe(self, host: str, watched: bool, is_ready: bool, now: float) -> Transition | None:
        """One look at ``host``; ``watched`` is False while nothing should run there or a rollout
        holds it out of rotation (then a firing alarm stays until the runtime answers again)."""
        if is_ready:
            self.unready_since.pop(host, None)
            if host in self.alarming:
                self.alarming.discard(host)
                return Transition(
                    RUNTIME_DOWN, self.severity, host, "ALARM", "OK", "its runtime is ready", now
                )
            return None
        if not watched:
            self.unready_since.pop(host, None)
            return None
        since = self.unready_since.setdefault(host, now)
        if host not in self.alarming and now - since >= self.after_s:
            self.alarming.add(host)
            reason = f"its runtime has not answered its readiness check for {now - since:.1f} s (limit {self.after_s:g} s)"
            return Transition(RUNTIME_DOWN, self.severity, host, "OK", "ALARM", reason, now)
        return None


@dataclass(frozen=True)
class Crossing:
    """One threshold watch's alarm on one host slot at one moment, and why it would change state."""

    alarm: str
    severity: Severity
    host: str
    now: float

    def judge(self, alarming: set[str], above: bool, why_up: str, why_down: str) -> Transition | None:
        """Into ALARM when ``above`` and the slot was not in ``alarming`` (the watch's set, kept
        here), back to OK when not ``above`` and it was; None while the state holds."""
        if above and self.host not in alarming:
            alarming.add(self.host)
            return Transition(self.alarm, self.severity, self.host, "OK", "ALARM", why_up, self.now)
        if not above and self.host in alarming:
            alarming.discard(self.host)
            return Transition(self.alarm, self.severity, self.host, "ALARM", "OK", why_down, self.now)
        return None


@dataclass
class RestartsWatch:
    """``runtime-restarts`` of every host slot: more than ``allowed`` restarts by the slot's
    supervisor within ``window_s`` -> ALARM; back within the allowance -> OK. A crash loop keeps
    ``runtime-down`` quiet on the cloud targets (each start is young), never here."""

    severity: Severity
    allowed: int = RESTARTS_ALLOWED
    window_s: float = RESTARTS_WINDOW_S
    #: Per slot, (when, its supervisor's count) readings: the oldest is the window's baseline.
    readings: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    alarming: set[str] = field(default_factory=set)

    def observe(self, host: str, restarts: int, now: float) -> Transition | None:
        history = self.readings.setdefault(host, [])
        if history and restarts < history[-1][1]:
            history.clear()  # a new supervisor counts from zero
        history.append((now, restarts))
        while len(history) > 1 and history[1][0] <= now - self.window_s:
            history.pop(0)
        within = restarts - history[0][1]
        minutes = f"{self.window_s / 60:g} minutes"
        return Crossing(RUNTIME_RESTARTS, self.severity, host, now).judge(
            self.alarming,
            within > self.allowed,
            f"its supervisor restarted the runtime {within} times in {minutes} (allowed {self.allowed})",
            f"{within} restart(s) in the last {minutes}",
        )


def supervisor_restarts(host: HostSpec) -> int:
    """How often the slot's supervisor restarted its runtime (its state file); 0 while it has none."""
    try:
        state = json.loads((Path(host.root) / "run" / SUPERVISOR_STATE_NAME).read_text())
        return int(state.get("restarts", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


@dataclass
class MetricWatch:
    """A named alarm on the runtime's metrics, per host slot: its declaration's measure since the
    slot's last scrape above the threshold -> ALARM; at or below -> OK; nothing to measure (no
    request finished, no constrained output checked) leaves the state as it is."""

    alarm: RuntimeMetricAlarm
    severity: Severity
    threshold: float
    scrapes: dict[str, Samples] = field(default_factory=dict)
    alarming: set[str] = field(default_factory=set)

    def observe(self, host: str, samples: Samples, now: float) -> Transition | None:
        value = self.alarm.measure(self.scrapes.get(host), samples)
        self.scrapes[host] = samples
        if value is None:
            return None
        return Crossing(self.alarm.name, self.severity, host, now).judge(
            self.alarming,
            value > self.threshold,
            f"{value:g} is above the threshold {self.threshold:g}",
            f"{value:g} is back at or below the threshold {self.threshold:g}",
        )

    def forget(self, host: str) -> None:
        """A slot that serves nothing (or is between runtimes) starts its next measure afresh."""
        self.scrapes.pop(host, None)


@dataclass
class ProbeWatch:
    """``probe-failing``: every ``interval_s`` one probe; ``failures`` in a row -> ALARM, a success -> OK."""

    severity: Severity
    failures: int = PROBE_FAILED_MINUTES
    interval_s: float = PROBE_INTERVAL_S
    last_run: float | None = None
    failed_in_a_row: int = 0
    alarming: bool = False

    def due(self, now: float) -> bool:
        return self.last_run is None or now - self.last_run >= self.interval_s

    def observe(self, result: probe.ProbeResult, now: float) -> Transition | None:
        self.last_run = now
        if result.ok:
            self.failed_in_a_row = 0
            if self.alarming:
                self.alarming = False
                reason = f"the probe succeeded in {result.latency_ms:.0f} ms"
                return Transition(PROBE_FAILING, self.severity, ENDPOINT, "ALARM", "OK", reason, now)
            return None
        self.failed_in_a_row += 1
        if not self.alarming and self.failed_in_a_row >= self.failures:
            self.alarming = True
            reason = f"the probe failed {self.failed_in_a_row} times in a row: {result.model}: {result.error}"
            return Transition(PROBE_FAILING, self.severity, ENDPOINT, "OK", "ALARM", reason, now)
        return None


@dataclass
class Watches:
    """One watch per named alarm: what the local stack evaluates, by the declaration's names."""

    down: RuntimeDown
    restarts: RestartsWatch
    metrics: list[MetricWatch]
    probe: ProbeWatch

    def names(self) -> list[str]:
        return [RUNTIME_DOWN, RUNTIME_RESTARTS, *(w.alarm.name for w in self.metrics), PROBE_FAILING]


def local_watches(settings: Settings) -> Watches:
    """The watches of this stack, thresholds and severities from its settings; every named alarm has one."""
    watches = Watches(
        down=RuntimeDown(settings.alerts.severity(RUNTIME_DOWN), settings.alerts.runtime_down_for_s),
        restarts=RestartsWatch(settings.alerts.severity(RUNTIME_RESTARTS)),
        metrics=[
            MetricWatch(alarm, alarm.severity(settings), alarm.threshold(settings))
            for alarm in NAMED_ALARMS.values()
            if isinstance(alarm, RuntimeMetricAlarm)
        ],
        probe=ProbeWatch(settings.alerts.severity(PROBE_FAILING)),
    )
    unwatched = sorted(set(NAMED_ALARMS) - set(watches.names()))
    if unwatched:
        raise FrontierError(f"named alarms without a watch on the local stack: {', '.join(unwatched)}")
    return watches


def scrape(pool: PoolSettings, host: HostSpec) -> Samples:
    """The /metrics of ``host``'s runtime, a slot of ``pool``."""
    with urllib.request.urlopen(runtime_url(pool, host, METRICS_PATH), timeout=2) as reply:
        return parse_prometheus(reply.read().decode())


# --- the stack's side: topics, routes, metrics ----------------------------------------------------


class Notifier:
    """SNS in moto: a topic per severity with the stack's routes subscribed (as Pulumi makes them
    on a cloud stack), and CloudWatch for the process metrics. moto's admin stands in for AWS's
    own services here (CloudWatch needs no IAM user of the stack to publish to SNS)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sns = cluster.aws_client(settings, "sns", actor="admin")
        self.sqs = cluster.aws_client(settings, "sqs", actor="admin")
        self.cloudwatch = cluster.aws_client(settings, "cloudwatch", actor="admin")
        self.topics: dict[Severity, str] = {}

    def provision(self) -> dict[Severity, str]:
        """Create the topics, the queues the routes name, and the subscriptions. Idempotent."""
        s = self.settings
        for severity in SEVERITIES:
            arn = self.sns.create_topic(Name=topic_name(s, severity))["TopicArn"]
            self.topics[severity] = arn
            route = s.alert_route(severity)
            existing = {
                (sub["Protocol"], sub["Endpoint"])
                for sub in self.sns.list_subscriptions_by_topic(TopicArn=arn)["Subscriptions"]
            }
            wanted = [("sqs", queue) for queue in route.sqs_queue_arns]
            wanted += [("email", address) for address in route.emails]
            # No https subscription here: moto would call the endpoint from this machine.
            for protocol, endpoint in wanted:
                if protocol == "sqs":
                    self.sqs.create_queue(QueueName=endpoint.rsplit(":", 1)[1])
                if (protocol, endpoint) not in existing:
                    self.sns.subscribe(TopicArn=arn, Protocol=protocol, Endpoint=endpoint)
        return self.topics

    def publish(self, transition: Transition) -> None:
        s = self.settings
        self.sns.publish(
            TopicArn=self.topics[transition.severity],
            Subject=transition.subject(s)[:99],
            Message=json.dumps(transition.message(s)),
        )

    def put_probe(self, result: probe.ProbeResult) -> None:
        """The probe's figures, as the EC2 probe's Lambda puts them."""
        probe.publish(self.cloudwatch, self.settings.stack, result)

    def put_usage(self, host: HostSpec, usage: ProcessUsage) -> None:
        stack_dim, group_dim = CLOUDWATCH_DIMENSIONS
        dimensions = [
            {"Name": stack_dim, "Value": self.settings.stack},
            {"Name": group_dim, "Value": host.group},
            {"Name": HOST_DIMENSION, "Value": host.name},
        ]
        self.cloudwatch.put_metric_data(
            Namespace=HOST_NAMESPACE,
            MetricData=[
                {
                    "MetricName": PROC_CPU_USER,
                    "Dimensions": dimensions,
                    "Value": usage.cpu_user_s,
                    "Unit": "Seconds",
                },
                {
                    "MetricName": PROC_CPU_SYSTEM,
                    "Dimensions": dimensions,
                    "Value": usage.cpu_system_s,
                    "Unit": "Seconds",
                },
                {"MetricName": PROC_RSS, "Dimensions": dimensions, "Value": usage.rss_bytes, "Unit": "Bytes"},
            ],
        )


class Evaluator:
    """One round after another: look at every in-service slot, publish usage and state changes."""

    def __init__(self, settings: Settings, notifier: Notifier, log: Callable[[str], None] = print) -> None:
        self.settings = settings
        # The stack's balancer and endpoint; every pool's slots, each watched at its pool's runtime.
        self.backend = LocalBackend(settings, None)
        self.notifier = notifier
        self.log = log
        self.watches = local_watches(settings)
        self.down = self.watches.down
        #: A runtime has answered ready since the evaluator started: from then on the probe runs every
        #: minute, whatever it finds. Before, the stack is still coming up (its first deploy), and a
        #: probe then would only fail and wait a minute to try again.
        self.has_served = False

    def round(self, now: float | None = None) -> list[Transition]:
        balancer = self.backend.balancer()
        changes: list[Transition | None] = []
        for pool, host in self._serving():
            at = time.time() if now is None else now
            serves = (Path(host.root) / CURRENT_LINK).exists()
            try:
                taken_out = balancer.state(host).startswith(TAKEN_OUT)
            except (FrontierError, OSError, KeyError):
                taken_out = False  # no balancer answer: judge the runtime alone
            is_ready = serves and ready(self.settings, pool, host)
            self.has_served = self.has_served or is_ready
            changes.append(self.down.observe(host.name, serves and not taken_out, is_ready, at))
            if is_ready:
                changes.extend(self._metrics(pool, host, at))
            else:
                for watch in self.watches.metrics:
                    watch.forget(host.name)
            if serves:
                changes.append(self.watches.restarts.observe(host.name, supervisor_restarts(host), at))
                self._usage(host)
        at = time.time() if now is None else now
        if self.has_served and self.watches.probe.due(at):
            changes.append(self._probe(at))
        fired = [change for change in changes if change is not None]
        for change in fired:
            self.notifier.publish(change)
            self.log(f"{change.subject(self.settings)}: {change.reason}")
        return fired

    def _serving(self) -> list[tuple[PoolSettings, HostSpec]]:
        return slots_in_service(self.settings)

    def _metrics(self, pool: PoolSettings, host: HostSpec, now: float) -> list[Transition | None]:
        try:
            samples = scrape(pool, host)
        except OSError:
            return []  # ready a moment ago, gone now: runtime-down judges that
        return [watch.observe(host.name, samples, now) for watch in self.watches.metrics]

    def _probe(self, now: float) -> Transition | None:
        result = probe.probe(
            self.backend.endpoint(),
            [pool.name for pool in self.settings.pools],
            self._probe_keys(),
            PROBE_TIMEOUT_S,
        )
        self.notifier.put_probe(result)
        return self.watches.probe.observe(result, now)

    def _probe_keys(self) -> dict[str, str]:
        """Each model's key: the first of its own pool's secret (behind a gateway its probe tenant
        knows every pool's keys). A pool whose secret ``up`` has not made yet is asked without one."""
        keys = {}
        for pool in self.settings.pools:
            with contextlib.suppress(cluster.LocalStackError):
                keys[pool.name] = cluster.api_key(self.settings, pool)
        return keys

    def _usage(self, host: HostSpec) -> None:
        try:
            usage = process_usage(runtime_pid(host))
        except FrontierError:
            return  # between a runtime's exit and its restart: nothing to measure
        self.notifier.put_usage(host, usage)

    def run(self, stop: Callable[[], bool]) -> None:
        interval = self.settings.alerts.evaluation_interval_s
        while not stop():
            started = time.monotonic()
            try:
                self.round()
            except Exception as exc:  # noqa: BLE001 - a round that fails must not end the watch
                self.log(f"round failed: {type(exc).__name__}: {exc}")
            time.sleep(max(0.0, interval - (time.monotonic() - started)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="frontier-local-alarms", description=__doc__.split("\n")[0])
    parser.add_argument("--stack", required=True)
    parser.add_argument("--stack-file", required=True)
    args = parser.parse_args(argv)
    # `local.up` loaded this file with every rule before it started this service; the same loader
    # reads it here without the cross-field rules, which live above this room (frontier.targets).
    settings = read_stack(args.stack, path=args.stack_file, rules=lambda _: ())
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))

    def log(line: str) -> None:
        print(f"{datetime.now(UTC).isoformat(timespec='milliseconds')} {line}", flush=True)

    notifier = Notifier(settings)
    topics = notifier.provision()
    log("topics: " + ", ".join(f"{severity} {arn}" for severity, arn in topics.items()))
    Evaluator(settings, notifier, log).run(lambda: bool(stopping))
    return 0


if __name__ == "__main__":
    sys.exit(main())
