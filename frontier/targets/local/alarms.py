"""The local stack's alarms: CloudWatch's part, played on this machine.

A service of the local stack (``local.up`` starts it, ``local.down`` stops it) that every
``alerts.evaluation_interval_s``:

* reads each in-service host slot's runtime process from ``/proc`` — CPU seconds (user, system) and
  resident memory — and publishes them to moto's CloudWatch under the names the CloudWatch agent
  uses on EC2 (``procstat_cpu_time_user``, ``procstat_cpu_time_system``, ``procstat_memory_rss`` in
  the runtime's namespace, dimensions Stack, NodeGroup and Host);
* evaluates ``runtime-down`` per slot: the slot serves a release, the balancer has not taken it out
  for a rollout (maintenance or drain), and its runtime has not answered its readiness check for
  ``alerts.runtime_down_for_s``; and recovers it once the runtime answers again;
* publishes each change of state (ALARM, OK) to the SNS topic of the alarm's severity in moto,
  as CloudWatch does: the stack's ``alerts.routes`` are that topic's subscriptions (an SQS queue in
  moto receives them; e-mail is subscribed but moto sends no mail).

Messages carry CloudWatch's alarm fields (``AlarmName``, ``NewStateValue``, ``OldStateValue``,
``NewStateReason``, ``StateChangeTime``, ``Region``) plus the host slot (``Host``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from frontier_hostside.names import CLOUDWATCH_DIMENSIONS, CURRENT_LINK

from frontier.config.load import read_stack
from frontier.config.schema import SEVERITIES, Settings, Severity
from frontier.errors import FrontierError
from frontier.hosts.inventory import HostSpec
from frontier.render.alerts import HOST_DIMENSION, HOST_NAMESPACE, PROC_CPU_SYSTEM, PROC_CPU_USER, PROC_RSS
from frontier.targets.local import cluster
from frontier.targets.local.backend import LocalBackend
from frontier.targets.local.heal import ready, runtime_pid

RUNTIME_DOWN = "runtime-down"
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
        self.backend = LocalBackend(settings)
        self.notifier = notifier
        self.log = log
        self.down = RuntimeDown(settings.alerts.severity(RUNTIME_DOWN), settings.alerts.runtime_down_for_s)

    def round(self, now: float | None = None) -> list[Transition]:
        balancer = self.backend.balancer()
        changes = []
        for host in self.backend.hosts():
            at = time.time() if now is None else now
            serves = (Path(host.root) / CURRENT_LINK).exists()
            try:
                taken_out = balancer.state(host).startswith(TAKEN_OUT)
            except (FrontierError, OSError, KeyError):
                taken_out = False  # no balancer answer: judge the runtime alone
            is_ready = serves and ready(self.settings, host)
            change = self.down.observe(host.name, serves and not taken_out, is_ready, at)
            if change is not None:
                self.notifier.publish(change)
                self.log(f"{change.subject(self.settings)}: {change.reason}")
                changes.append(change)
            if serves:
                self._usage(host)
        return changes

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
