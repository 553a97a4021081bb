"""The named alarms every target raises under the same names, declared once.

Each registered class is one alarm: its name (a key of
:data:`~frontier.config.schema.ALARM_SEVERITIES`, so the stack's ``alerts.severities`` and
``alerts.routes`` decide who hears of it), the series it reads, its threshold from the stack's
settings, and its form on each target, read by:

* EC2 (:mod:`infra.monitoring`): a CloudWatch alarm ``frontier-<stack>-<name>`` on the series each
  host's bootstrap publishes (``frontier_hostside/node_boot.py``, ``publish``) or the synthetic
  probe's Lambda publishes (``frontier_hostside/probe.py``);
* Kubernetes, and every stack's rendered ``monitoring/alerts.yaml`` (:mod:`frontier.render.alerts`):
  a Prometheus rule labelled ``alarm: <name>``;
* the local stack (:mod:`frontier.targets.local.alarms`): its evaluator reads each runtime's
  /metrics with :meth:`RuntimeMetricAlarm.measure`, watches readiness, runs the probe, and
  publishes each change of state to the severity's topic.

The alarm table of ``docs/operate.md`` is :func:`alarm_table_markdown`'s output.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from frontier_hostside import names
from frontier_hostside.node_boot import histogram_buckets

from frontier.config.schema import ALARM_SEVERITIES, Settings, Severity

# The synthetic probe: a fixed request through the public endpoint every minute; it fails on any
# answer but a completion within PROBE_TIMEOUT_S, and the alarm fires after PROBE_FAILED_MINUTES
# failed minutes in a row (one lost request is the network's, two are ours).
PROBE_INTERVAL_S = 60
PROBE_TIMEOUT_S = 20
PROBE_FAILED_MINUTES = 2
# The rate window of the Prometheus rules, and the CloudWatch period: a minute, 3 of 5 breaching.
WINDOW = "5m"
PERIOD_S = 60
EVALUATION_PERIODS = 5
DATAPOINTS_TO_ALARM = 3
RUNTIME_JOB = 'job="frontier-runtime"'
# On the cloud targets runtime-down counts minutes in a row, at least this many: one reading may fall
# between a release's stop on a host and its next launch, where nothing answers yet.
CLOUD_DOWN_MIN_MINUTES = 2
# runtime-restarts: more than RESTARTS_ALLOWED restarts by a runtime's supervisor within
# RESTARTS_WINDOW_S. A crash loop never reads as down (each start is younger than a start may take),
# and its back-off (the kubelet's grows to 5 minutes) still restarts it twice in ten minutes.
RESTARTS_WINDOW_S = 600
RESTARTS_ALLOWED = 1

# One scrape of a runtime's /metrics: (name, labels, value) per sample.
Samples = Sequence[tuple[str, dict[str, str], float]]


def probe_job_name(stack: str) -> str:
    """The probe's Lambda on EC2, and its CronJob on Kubernetes (``<it>-<model>`` for each model of
    a stack of several, each run as its pool's identity)."""
    return f"frontier-{stack}-probe"


@dataclass(frozen=True)
class Scope:
    """The label matchers that keep one stack's rules to that stack's series.

    One Prometheus often scrapes several stacks (a cluster's staging and production namespaces): a
    rule that selects by the runtime's job alone would page production for staging's errors. On
    Kubernetes the stack's namespace scopes every series its rules read (the operator labels each
    scraped target with its namespace; kube-state-metrics labels each object's series with the
    object's). Hosts scraped outside a cluster have no such label: there the scope is empty and a
    Prometheus that scrapes two stacks' hosts gives each its own job.
    """

    namespace: str | None = None

    def select(self, metric: str, *matchers: str) -> str:
        """``metric{matchers, the scope's}``: a vector selector of this stack's series."""
        labels = [*matchers, *([f'namespace="{self.namespace}"'] if self.namespace else [])]
        return f"{metric}{{{','.join(labels)}}}" if labels else metric

    def runtime(self, metric: str, *matchers: str) -> str:
        """A series the stack's runtimes export, as its Prometheus scrapes them."""
        return self.select(metric, RUNTIME_JOB, *matchers)


HOSTS = Scope()


@dataclass(frozen=True)
class CloudWatchCondition:
    """A CloudWatch alarm's condition on the series of :data:`names.CLOUDWATCH_NAMESPACE`: one
    metric with a statistic (``pNN`` is an extended statistic), or ``failed / checked`` sums."""

    threshold: float
    metric: str = ""
    statistic: str = ""
    ratio: tuple[str, str] | None = None
    comparison: Literal["GreaterThanThreshold", "LessThanThreshold"] = "GreaterThanThreshold"
    evaluation_periods: int = EVALUATION_PERIODS
    datapoints_to_alarm: int = DATAPOINTS_TO_ALARM
    # A probe that publishes nothing is a probe that does not run: that is a failure too.
    treat_missing_data: Literal["notBreaching", "breaching"] = "notBreaching"
    # The probe's series carry the stack only; the runtime's the stack and the node group.
    per_node_group: bool = True
    period_s: int = PERIOD_S

    def read(self) -> list[str]:
        """The metric names this condition reads."""
        return list(self.ratio) if self.ratio else [self.metric]

    def alarm_inputs(self, dimensions: dict[str, str]) -> dict[str, Any]:
        """The MetricAlarm arguments of this condition (Pulumi's names)."""
        shared: dict[str, Any] = {
            "threshold": self.threshold,
            "comparison_operator": self.comparison,
            "evaluation_periods": self.evaluation_periods,
            "datapoints_to_alarm": self.datapoints_to_alarm,
            "treat_missing_data": self.treat_missing_data,
        }
        if self.ratio is not None:
            failed, checked = self.ratio

            def total(query_id: str, metric: str) -> dict[str, Any]:
                return {
                    "id": query_id,
                    "return_data": False,
                    "metric": {
                        "namespace": names.CLOUDWATCH_NAMESPACE,
                        "metric_name": metric,
                        "dimensions": dict(dimensions),
                        "period": self.period_s,
                        "stat": "Sum",
                    },
                }

            # A minute without any checked output is a rate of 0, not 0/0.
            shared["metric_queries"] = [
                total("failed", failed),
                total("checked", checked),
                {
                    "id": "rate",
                    "expression": "IF(checked > 0, FILL(failed, 0) / checked, 0)",
                    "label": f"{failed} / {checked}",
                    "return_data": True,
                },
            ]
            return shared
        statistic = (
            {"extended_statistic": self.statistic}
            if self.statistic.startswith("p")
            else {"statistic": self.statistic}
        )
        return {
            **shared,
            "namespace": names.CLOUDWATCH_NAMESPACE,
            "metric_name": self.metric,
            "dimensions": dict(dimensions),
            "period": self.period_s,
            **statistic,
        }


@dataclass(frozen=True)
class PrometheusCondition:
    """A Prometheus alerting rule: its alert name, its expression (the comparison included), and
    how long the expression must hold."""

    alert: str
    expr: str
    for_s: int
    summary: str
    description: str = ""

    @property
    def for_(self) -> str:
        return f"{self.for_s // 60}m" if self.for_s % 60 == 0 else f"{self.for_s}s"


class NamedAlarm(ABC):
    """One alarm of every target. ``series`` and ``fires`` say in words what it reads and when."""

    name: ClassVar[str]
    series: ClassVar[str]
    fires: ClassVar[str]

    def severity(self, settings: Settings) -> Severity:
        return settings.alerts.severity(self.name)

    @abstractmethod
    def threshold(self, settings: Settings) -> float: ...

    @abstractmethod
    def prometheus(self, settings: Settings, scope: Scope) -> PrometheusCondition: ...

    @abstractmethod
    def cloudwatch(self, settings: Settings) -> CloudWatchCondition: ...


class RuntimeMetricAlarm(NamedAlarm):
    """An alarm on the runtime's own metrics: the local evaluator measures it between two scrapes
    of one runtime (``before`` is None at the first) and compares with :meth:`threshold`."""

    @abstractmethod
    def measure(self, before: Samples | None, now: Samples) -> float | None:
        """The figure the threshold is compared with; None when there is nothing to judge."""


class SeriesAboveAlarm(RuntimeMetricAlarm):
    """A runtime series above the stack's threshold: on CloudWatch one metric of the hosts' series
    with one statistic (``pNN`` an extended statistic)."""

    cloudwatch_metric: ClassVar[str]
    statistic: ClassVar[str]

    def cloudwatch(self, settings: Settings) -> CloudWatchCondition:
        return CloudWatchCondition(self.threshold(settings), self.cloudwatch_metric, self.statistic)


class FailingMinutesAlarm(NamedAlarm):
    """A series that is 1 while all is well: on CloudWatch its Minimum below 1 for
    :meth:`minutes` periods in a row fires."""

    cloudwatch_metric: ClassVar[str]
    missing_data: ClassVar[Literal["notBreaching", "breaching"]] = "notBreaching"
    per_node_group: ClassVar[bool] = True

    @abstractmethod
    def minutes(self, settings: Settings) -> int: ...

    def cloudwatch(self, settings: Settings) -> CloudWatchCondition:
        minutes = self.minutes(settings)
        return CloudWatchCondition(
            1,
            self.cloudwatch_metric,
            "Minimum",
            comparison="LessThanThreshold",
            evaluation_periods=minutes,
            datapoints_to_alarm=minutes,
            treat_missing_data=self.missing_data,
            per_node_group=self.per_node_group,
        )


NAMED_ALARMS: dict[str, NamedAlarm] = {}


Registered = TypeVar("Registered", bound=type[NamedAlarm])


def named(cls: Registered) -> Registered:
    NAMED_ALARMS[cls.name] = cls()
    return cls


def _counter(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        value
        for sample, have, value in samples
        if sample == name and all(have.get(k) == v for k, v in labels.items())
    )


@named
class TtftP99(SeriesAboveAlarm):
    name = "ttft"
    series = f"`{names.TTFT_METRIC}` histogram (EC2: `{names.TTFT_CW_METRIC}`, ms, values with counts)"
    fires = "p99 time to first token above `slo.ttft_ms`"
    cloudwatch_metric = names.TTFT_CW_METRIC
    statistic = "p99"

    def threshold(self, settings: Settings) -> float:
        return settings.slo.ttft_ms

    def prometheus(self, settings: Settings, scope: Scope) -> PrometheusCondition:
        seconds = self.threshold(settings) / 1000
        buckets = scope.runtime(f"{names.TTFT_METRIC}_bucket")
        return PrometheusCondition(
            alert="FrontierTTFTHigh",
            expr=f"histogram_quantile(0.99, sum by (le) (rate({buckets}[{WINDOW}]))) > {seconds}",
            for_s=600,
            summary=f"p99 time to first token is above the SLO of {seconds} s",
            description="Requests wait too long for their first token: queueing or prefill is saturated. "
            "Check the queue depth and add replicas (fab plan).",
        )

    def measure(self, before: Samples | None, now: Samples) -> float | None:
        """The p99 of the requests since ``before``, in ms: the upper bound of the bucket it falls
        in (what CloudWatch computes from the values with counts the hosts publish)."""
        buckets = histogram_buckets(list(now), names.TTFT_METRIC)
        earlier = histogram_buckets(list(before), names.TTFT_METRIC) if before is not None else {}
        if any(buckets.get(bound, 0.0) < count for bound, count in earlier.items()):
            earlier = {}  # a restarted runtime counts from zero
        delta = {bound: buckets[bound] - earlier.get(bound, 0.0) for bound in sorted(buckets)}
        total = delta.get(math.inf, 0.0)
        if total <= 0:
            return None
        finite = [b for b in delta if b != math.inf]
        for bound, count in delta.items():
            if count >= 0.99 * total:
                return (bound if bound != math.inf else (finite[-1] if finite else 0.0)) * 1000
        return None


@named
class KvCacheFull(SeriesAboveAlarm):
    name = "kv-cache-full"
    series = f"`{names.KV_USAGE_METRIC}` gauge (EC2: `{names.KV_USAGE_CW_METRIC}`, the fullest host)"
    fires = "a runtime's KV cache fuller than `monitoring.kv_usage_alarm`"
    cloudwatch_metric = names.KV_USAGE_CW_METRIC
    statistic = "Maximum"

    def threshold(self, settings: Settings) -> float:
        return settings.monitoring.kv_usage_alarm

    def prometheus(self, settings: Settings, scope: Scope) -> PrometheusCondition:
        limit = self.threshold(settings)
        return PrometheusCondition(
            alert="FrontierKVCacheFull",
            expr=f"max by (instance) ({scope.runtime(names.KV_USAGE_METRIC)}) > {limit}",
            for_s=600,
            summary=f"{{{{ $labels.instance }}}} uses more than {round(limit * 100)}% of its KV cache",
            description="Sequences are being preempted and recomputed; lower max_batch_size or add replicas.",
        )

    def measure(self, before: Samples | None, now: Samples) -> float | None:
        found = [value for sample, _, value in now if sample == names.KV_USAGE_METRIC]
        return max(found) if found else None


@named
class StructuredOutputFailures(RuntimeMetricAlarm):
    name = "structured-output-failures"
    series = (
        f'`{names.REQUEST_FAILURES_METRIC}{{reason="{names.STRUCTURED_OUTPUT_INVALID}"}}` over '
        f"`{names.STRUCTURED_OUTPUTS_METRIC}` (EC2: `{names.STRUCTURED_FAILURES_CW_METRIC}` / "
        f"`{names.STRUCTURED_OUTPUTS_CW_METRIC}`)"
    )
    fires = "constrained outputs failing their constraint at a rate above `slo.error_rate`"

    def threshold(self, settings: Settings) -> float:
        return settings.slo.error_rate

    def prometheus(self, settings: Settings, scope: Scope) -> PrometheusCondition:
        reason = f'{names.REASON_LABEL}="{names.STRUCTURED_OUTPUT_INVALID}"'
        failed = scope.runtime(f"{names.REQUEST_FAILURES_METRIC}_total", reason)
        checked = scope.runtime(f"{names.STRUCTURED_OUTPUTS_METRIC}_total")
        return PrometheusCondition(
            alert="FrontierStructuredOutputFailing",
            expr=(
                f"sum(rate({failed}[{WINDOW}])) / clamp_min(sum(rate({checked}[{WINDOW}])), 1e-9) "
                f"> {self.threshold(settings)}"
            ),
            for_s=300,
            summary=f"more than {self.threshold(settings)} of constrained outputs fail their constraint",
            description="The runtime logs each one with its raw output (structured_output_invalid): "
            "a grammar backend or a model that no longer follows its constraint.",
        )

    def cloudwatch(self, settings: Settings) -> CloudWatchCondition:
        return CloudWatchCondition(
            self.threshold(settings),
            ratio=(names.STRUCTURED_FAILURES_CW_METRIC, names.STRUCTURED_OUTPUTS_CW_METRIC),
        )

    def measure(self, before: Samples | None, now: Samples) -> float | None:
        failed_name = f"{names.REQUEST_FAILURES_METRIC}_total"
        checked_name = f"{names.STRUCTURED_OUTPUTS_METRIC}_total"
        reason = {names.REASON_LABEL: names.STRUCTURED_OUTPUT_INVALID}
        failed, checked = _counter(now, failed_name, **reason), _counter(now, checked_name)
        if before is not None:
            failed_before, checked_before = (
                _counter(before, failed_name, **reason),
                _counter(before, checked_name),
            )
            if checked >= checked_before:  # else a restarted runtime: count from zero
                failed, checked = failed - failed_before, checked - checked_before
        return failed / checked if checked > 0 else None


@named
class RuntimeDown(FailingMinutesAlarm):
    name = "runtime-down"
    series = (
        f"`{names.READY_METRIC}`, `{names.DRAINING_METRIC}`, `{names.PROCESS_START_METRIC}` "
        f"(EC2: `{names.RUNTIME_UP_CW_METRIC}`, the host's verdict, the group's worst host)"
    )
    fires = (
        "a runtime down for `alerts.runtime_down_for_s`: not ready, not draining, and past its start "
        "(its process older than `rollout.readiness_timeout_s`; on EC2 a runtime that does not answer, "
        f"unless launched or its host booted that recently); on EC2 and Kubernetes whole minutes, at "
        f"least {CLOUD_DOWN_MIN_MINUTES}; locally a rollout's own hosts are excepted"
    )

    # Each host publishes 1 (up: ready, draining or starting) or 0 (down): see
    # frontier_hostside.node_boot.runtime_down; the group's Minimum is its worst host.
    cloudwatch_metric = names.RUNTIME_UP_CW_METRIC

    def threshold(self, settings: Settings) -> float:
        return settings.alerts.runtime_down_for_s

    def minutes(self, settings: Settings) -> int:
        """On the cloud targets: whole minutes, at least :data:`CLOUD_DOWN_MIN_MINUTES`."""
        return max(CLOUD_DOWN_MIN_MINUTES, math.ceil(self.threshold(settings) / PERIOD_S))

    def prometheus(self, settings: Settings, scope: Scope) -> PrometheusCondition:
        """Not ready, unless draining or younger than a start may take (the process's start time)."""
        allowance = math.ceil(settings.rollout.readiness_timeout_s)
        return PrometheusCondition(
            alert="FrontierHostNotReady",
            expr=(
                f"({scope.runtime(names.READY_METRIC)} == 0)"
                f" unless on(instance) ({scope.runtime(names.DRAINING_METRIC)} == 1)"
                f" unless on(instance) (time() - {scope.runtime(names.PROCESS_START_METRIC)} < {allowance})"
            ),
            for_s=int(self.minutes(settings) * PERIOD_S),
            summary=f"{{{{ $labels.instance }}}} has been down for {self.minutes(settings)} minute(s)",
        )


@named
class RuntimeRestarts(NamedAlarm):
    name = "runtime-restarts"
    series = (
        f"restarts by the runtime's supervisor (EC2: `{names.RESTARTS_CW_METRIC}`, systemd's and the "
        "watchdog's; Kubernetes: `kube_pod_container_status_restarts_total`, the kubelet's; local: "
        f"each slot's `run/{names.SUPERVISOR_STATE_NAME}`)"
    )
    fires = (
        f"a runtime restarted more than {RESTARTS_ALLOWED} time(s) in {RESTARTS_WINDOW_S // 60} minutes: "
        "crash-looping or failing liveness, which `runtime-down` does not see (each start is young)"
    )

    def threshold(self, settings: Settings) -> float:
        return RESTARTS_ALLOWED

    def prometheus(self, settings: Settings, scope: Scope) -> PrometheusCondition:
        """One rule for every Prometheus: where kube-state-metrics runs, the kubelet's count of the
        runtime container's restarts (it sees a container that dies before any scrape), and the
        scraped runtime's own process starts only for what no pod of the cluster's is (hosts
        scraped elsewhere: there a rollout's restart counts too)."""
        window = f"{RESTARTS_WINDOW_S // 60}m"
        restarts = scope.select(
            "kube_pod_container_status_restarts_total", f'container="{names.CONTAINER_NAME}"'
        )
        starts = scope.runtime(names.PROCESS_START_METRIC)
        pods = scope.select("kube_pod_info")
        return PrometheusCondition(
            alert="FrontierRuntimeRestarting",
            expr=(
                f"(sum by (namespace, pod) (increase({restarts}[{window}])) > {RESTARTS_ALLOWED})"
                f" or (changes({starts}[{window}]) > {RESTARTS_ALLOWED} unless on(namespace, pod) {pods})"
            ),
            for_s=PERIOD_S,
            summary=(
                "{{ $labels.pod }}{{ $labels.instance }} restarted its runtime more than "
                f"{RESTARTS_ALLOWED} time(s) in {window}"
            ),
            description="A crash loop or failing liveness: the runtime's log says why it exited "
            "(fab logs, or the pod's previous container).",
        )

    def cloudwatch(self, settings: Settings) -> CloudWatchCondition:
        # Each host publishes the restarts since its last publish; one period spans the window.
        return CloudWatchCondition(
            RESTARTS_ALLOWED,
            names.RESTARTS_CW_METRIC,
            "Sum",
            evaluation_periods=1,
            datapoints_to_alarm=1,
            period_s=RESTARTS_WINDOW_S,
        )


@named
class ProbeFailing(FailingMinutesAlarm):
    name = "probe-failing"
    series = (
        f"the synthetic probe (EC2: `{names.PROBE_SUCCESS_CW_METRIC}`, `{names.PROBE_LATENCY_CW_METRIC}`; "
        "Kubernetes: its CronJob's last success; local: the evaluator's probe)"
    )
    fires = f"the fixed request through the public endpoint failing {PROBE_FAILED_MINUTES} minutes in a row"
    cloudwatch_metric = names.PROBE_SUCCESS_CW_METRIC
    # Its series carry the stack only; a minute without one is a minute the probe did not run.
    missing_data = "breaching"
    per_node_group = False

    def threshold(self, settings: Settings) -> float:
        return PROBE_FAILED_MINUTES

    def minutes(self, settings: Settings) -> int:
        return PROBE_FAILED_MINUTES

    def prometheus(self, settings: Settings, scope: Scope) -> PrometheusCondition:
        # kube-state-metrics (of the Prometheus stack) publishes each CronJob's last successful run:
        # the stalest of the stack's probes (one per model) is the one that fires.
        name = probe_job_name(settings.stack)
        job = scope.select("kube_cronjob_status_last_successful_time", f'cronjob=~"{name}(-.+)?"')
        stale_s = (PROBE_FAILED_MINUTES + 1) * PROBE_INTERVAL_S
        return PrometheusCondition(
            alert="FrontierProbeFailing",
            expr=f"(time() - min(max by (cronjob) ({job})) > {stale_s}) or absent({job})",
            for_s=PROBE_INTERVAL_S,
            summary=f"the synthetic probe has not succeeded for {PROBE_FAILED_MINUTES} minutes",
            description="A fixed request through the public endpoint fails: what clients see. "
            "Its job's log says why (status, error, latency).",
        )


def runtime_metric_alarms() -> list[RuntimeMetricAlarm]:
    return [a for a in NAMED_ALARMS.values() if isinstance(a, RuntimeMetricAlarm)]


# --- the table of docs/operate.md -------------------------------------------------------------------

TABLE_BEGIN = "<!-- named alarms: generated by `python -m frontier.alarms` -->"
TABLE_END = "<!-- end of named alarms -->"


LOCAL_READS = {
    RuntimeDown.name: "each slot's readiness",
    RuntimeRestarts.name: "each slot's supervisor",
    ProbeFailing.name: "its probe, every minute",
}


def alarm_table_markdown() -> str:
    """The table of named alarms, each with what every target makes of it."""
    rows = [
        "| Alarm | Reads | Fires when | Default severity | EC2 | Kubernetes | Local stack |",
        "|---|---|---|---|---|---|---|",
    ]
    for alarm in NAMED_ALARMS.values():
        local = LOCAL_READS.get(alarm.name, "each runtime's /metrics")
        rows.append(
            f"| `{alarm.name}` | {alarm.series} | {alarm.fires} | {ALARM_SEVERITIES[alarm.name]} | "
            f"CloudWatch alarm `frontier-<stack>-{alarm.name}` | PrometheusRule alert, label "
            f"`alarm: {alarm.name}` | evaluator ({local}) |"
        )
    return "\n".join([TABLE_BEGIN, *rows, TABLE_END])


if __name__ == "__main__":
    print(alarm_table_markdown())
