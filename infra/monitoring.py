"""Monitoring: log groups, one alarm topic per severity, CloudWatch alarms against the stack's SLOs and
the hosts' resources, a dashboard.

Each alarm has a severity (``alerts.severities`` of the stack, else the default table of
:data:`frontier.config.schema.ALARM_SEVERITIES`) and notifies that severity's SNS topic when it fires
and when it recovers (OK actions), so a page clears itself. Each topic's subscriptions are the
stack's ``alerts.routes`` of that severity (e-mail, SQS, HTTPS).

Alarms:
- ALB 5xx rate (ELB + target 5xx over requests, metric math) above ``slo.error_rate``;
- p99 end-to-end latency of whole requests above ``slo.p99_latency_ms``, from the runtime's own
  histogram (the ALB's TargetResponseTime is time to first byte for a stream);
- unhealthy hosts beyond what a rollout takes out at once (a rollout's own hosts do not page);
- runtime queue depth above ``monitoring.queue_depth_alarm``;
- per node group, from the CloudWatch agent (``templates/cloudwatch-agent.json.j2``): host memory and
  the weights cache's disk, and on GPU groups the fullest GPU's memory and the hottest GPU;
- the named alarms of every target (:mod:`frontier.alarms`: ``ttft``, ``kv-cache-full``,
  ``structured-output-failures``, ``runtime-down``, ``probe-failing``), each its declaration's
  CloudWatch condition on the series the hosts (and the probe) publish;
- the synthetic probe (:mod:`infra.probe`): a scheduled Lambda sending a fixed request through the
  stack's public endpoint every minute;
- with a gateway on its own hosts (infra/gateway.py): the gateway's own 5xx rate (its published
  ``Gateway5xx`` over ``GatewayRequests``) above ``slo.error_rate``, any gateway host unhealthy in
  the target group (a gateway roll launches each replacement before an old host goes, so none
  should be), and the busiest gateway host's CPU above :data:`GATEWAY_CPU_PERCENT`. They take the
  severities of ``5xx-rate``, ``unhealthy-hosts`` and ``host-memory`` (the stack's
  ``alerts.severities`` move them along).

Each host's bootstrap (``frontier_hostside/bootstrap.py watch``) scrapes the runtime's /metrics and
publishes ``QueueDepth``, ``RunningRequests``, ``EndToEndLatency`` and ``TimeToFirstToken`` (values
with counts), ``KVCacheUsage``, ``StructuredOutputs`` and ``StructuredOutputFailures``,
``RuntimeUp`` and ``RuntimeRestarts`` in the ``Frontier/Runtime`` namespace under the dimensions ``Stack`` and ``NodeGroup`` (see
:func:`runtime_dimensions`); the alarms, the dashboard and the scaling policy read exactly those.
The log groups receive the CloudWatch agent's files (``templates/cloudwatch-agent.json.j2``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
from frontier_hostside.names import (
    CLOUDWATCH_DIMENSIONS,
    E2E_LATENCY_CW_METRIC,
    GATEWAY_5XX_CW_METRIC,
    GATEWAY_NODE_GROUP,
    GATEWAY_REQUESTS_CW_METRIC,
    QUEUE_DEPTH_METRIC,
)
from frontier_hostside.names import CLOUDWATCH_NAMESPACE as METRIC_NAMESPACE

from frontier.alarms import NAMED_ALARMS
from frontier.config.schema import SEVERITIES, AlertRoute, Settings, Severity, Slo
from frontier.identity.cloud import Cloud
from frontier.identity.documents import log_group_name
from frontier.render import alerts as host
from frontier.render.alerts import ResourceLimits
from frontier.render.dashboards import resource_panels
from infra.component import Component
from infra.lambda_function import FunctionVpc
from infra.probe import SyntheticProbeArgs, synthetic_probe

ALB_NAMESPACE = "AWS/ApplicationELB"
PERIOD_S = 60
EVALUATION_PERIODS = 5
DATAPOINTS_TO_ALARM = 3
# The busiest gateway host's CPU (percent, as the agent publishes it): past this for 3 of 5 minutes
# the group needs more or larger hosts before its event loops start to queue requests.
GATEWAY_CPU_PERCENT = 80.0


def runtime_dimensions(stack: str, node_group: str) -> dict[str, str]:
    return dict(zip(CLOUDWATCH_DIMENSIONS, (stack, node_group), strict=True))


@dataclass(frozen=True)
class MonitoringArgs:
    stack: str
    region: str
    slo: Slo
    queue_depth_alarm: int
    # The node groups whose runtimes serve (each pool's, each half of a disaggregated one): their
    # latency, queue and restart alarms, named by group where there are several.
    serving_groups: Sequence[str]
    # Hosts a rollout takes out of service at once: more unhealthy hosts than this is an incident.
    unhealthy_allowance: int
    # Where each severity's messages go, and each alarm's severity (alarm name -> severity).
    routes: Mapping[Severity, AlertRoute]
    severities: Mapping[str, Severity]
    # Node group name -> whether its hosts have GPUs: the resource alarms of each group.
    node_groups: Mapping[str, bool]
    limits: ResourceLimits
    kms_key_arn: pulumi.Input[str]
    log_retention_days: int
    alb_arn_suffix: pulumi.Input[str]
    target_group_arn_suffix: pulumi.Input[str]
    asg_names: Sequence[pulumi.Input[str]]
    tags: Mapping[str, str]
    # The named alarms' thresholds (frontier.alarms) are the stack's settings.
    settings: Settings
    # The synthetic probe: where clients reach the stack, and the secret of the key it presents to
    # each model (its pool's), by model name.
    cloud: Cloud
    endpoint: pulumi.Input[str]
    probe_key_secret_arns: Mapping[str, pulumi.Input[str]]
    # Where the probe runs inside the VPC (infra.probe.probe_door); None: from AWS's network.
    probe_vpc: FunctionVpc | None = None
    # The ALB's targets are the gateway's hosts (infra/gateway.py): its log group and alarms.
    gateway: bool = False


def query_series(
    query_id: str, namespace: str, metric: str, dims: Mapping[str, Any], stat: str
) -> dict[str, Any]:
    """A series a metric-math alarm reads, ``stat`` of each minute: the alarm watches the expression
    over its series, not the series themselves."""
    return {
        "id": query_id,
        "return_data": False,
        "metric": {
            "namespace": namespace,
            "metric_name": metric,
            "dimensions": dict(dims),
            "period": PERIOD_S,
            "stat": stat,
        },
    }


def gateway_error_rate_queries(dims: Mapping[str, str]) -> list[dict[str, Any]]:
    """The gateway's 5xx answers over all its answers per minute (what its hosts publish); a minute
    without requests (its hosts publish 0) is a rate of 0, not 0/0."""
    return [
        query_series("errors", METRIC_NAMESPACE, GATEWAY_5XX_CW_METRIC, dims, "Sum"),
        query_series("answered", METRIC_NAMESPACE, GATEWAY_REQUESTS_CW_METRIC, dims, "Sum"),
        {
            "id": "errorrate",
            "expression": "IF(answered > 0, FILL(errors, 0) / answered, 0)",
            "label": "gateway 5xx / requests",
            "return_data": True,
        },
    ]


def error_rate_queries(alb: pulumi.Input[str]) -> list[dict[str, Any]]:
    """(ELB 5xx + target 5xx) / requests per minute; no traffic is no data, not an error rate of 0/0."""
    lb = {"LoadBalancer": alb}
    return [
        query_series("elb5xx", ALB_NAMESPACE, "HTTPCode_ELB_5XX_Count", lb, "Sum"),
        query_series("target5xx", ALB_NAMESPACE, "HTTPCode_Target_5XX_Count", lb, "Sum"),
        query_series("requests", ALB_NAMESPACE, "RequestCount", lb, "Sum"),
        {
            "id": "errorrate",
            "expression": "(FILL(elb5xx, 0) + FILL(target5xx, 0)) / requests",
            "label": "5xx / requests",
            "return_data": True,
        },
    ]


def series(namespace: str, metric: str, dims: Mapping[str, str], **statistic: str) -> dict[str, Any]:
    """The series an alarm watches, minute by minute: ``statistic=`` (or ``extended_statistic=``, a
    percentile) of ``metric`` under ``dims``."""
    return {
        "namespace": namespace,
        "metric_name": metric,
        "dimensions": dict(dims),
        **statistic,
        "period": PERIOD_S,
    }


def agent_series(metric: str, dims: Mapping[str, str], stat: str = "Maximum") -> dict[str, Any]:
    """A CloudWatch agent series rolled up over a node group (the fullest host by default)."""
    return series(host.HOST_NAMESPACE, metric, dims, statistic=stat)


def gpu_memory_queries(dims: Mapping[str, str]) -> list[dict[str, Any]]:
    """The fullest GPU's memory in use, as a fraction: its MiB used over the MiB a GPU has."""
    return [
        query_series("used", host.HOST_NAMESPACE, host.GPU_MEM_USED, dims, "Maximum"),
        query_series("total", host.HOST_NAMESPACE, host.GPU_MEM_TOTAL, dims, "Maximum"),
        {"id": "gpumemory", "expression": "used / total", "label": "GPU memory used", "return_data": True},
    ]


class Monitoring(Component[MonitoringArgs]):
    topic_arn: pulumi.Output[str]
    runtime_log_group: pulumi.Output[str]
    dashboard_name: pulumi.Output[str]

    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:monitoring:Monitoring", name, args, opts)
        tags = dict(args.tags)

        groups = {
            purpose: aws.cloudwatch.LogGroup(
                f"{name}-{purpose}",
                name=log_group_name(args.stack, purpose),
                retention_in_days=args.log_retention_days,
                kms_key_id=args.kms_key_arn,
                tags=tags,
                opts=self._child,
            )
            for purpose in ("runtime", "cloud-init", *(("gateway",) if args.gateway else ()))
        }
        self.topic_arns: dict[Severity, pulumi.Output[str]] = {
            severity: self._topic(severity) for severity in SEVERITIES
        }
        self._alarms()
        self._named_alarms()
        synthetic_probe(
            f"{name}-probe",
            SyntheticProbeArgs(
                stack=args.stack,
                cloud=args.cloud,
                endpoint=args.endpoint,
                models=[pool.name for pool in args.settings.pools],
                key_secret_arns=[args.probe_key_secret_arns[pool.name] for pool in args.settings.pools],
                kms_key_arn=args.kms_key_arn,
                log_retention_days=args.log_retention_days,
                tags=tags,
                vpc=args.probe_vpc,
            ),
            self,
        )
        self._resource_alarms()
        if args.gateway:
            self._gateway_alarms()
        dashboard = self._dashboard()

        # The page topic: what the stack's outputs have always called its alarm topic.
        self.topic_arn = self.topic_arns["page"]
        self.runtime_log_group = groups["runtime"].name
        self.dashboard_name = dashboard.dashboard_name
        self.register_outputs({"topic_arns": dict(self.topic_arns), "dashboard": dashboard.dashboard_name})

    def _topic(self, severity: Severity) -> pulumi.Output[str]:
        """The severity's SNS topic (encrypted with the stack's key) and its route's subscriptions."""
        args = self._args
        topic = aws.sns.Topic(
            f"{self._name}-{severity}",
            name=f"frontier-{args.stack}-{severity}",
            display_name=f"Frontier {args.stack} {severity}",
            kms_master_key_id=args.kms_key_arn,
            tags=dict(args.tags),
            opts=self._child,
        )
        route = args.routes[severity]
        # E-mail subscriptions stay pending until the recipient confirms the mail AWS sends; an SQS
        # queue's own policy must let this topic send to it (and its key, where encrypted).
        endpoints = [
            *(("email", e) for e in route.emails),
            *(("sqs", q) for q in route.sqs_queue_arns),
            *(("https", u) for u in route.https_endpoints),
        ]
        for i, (protocol, endpoint) in enumerate(endpoints):
            aws.sns.TopicSubscription(
                f"{self._name}-{severity}-{protocol}-{i}",
                topic=topic.arn,
                protocol=protocol,
                endpoint=endpoint,
                opts=self._child,
            )
        return topic.arn

    def _alarm(self, key: str, description: str, *, alarm: str | None = None, **kwargs: Any) -> None:
        """CloudWatch alarm ``frontier-<stack>-<key>``; ``alarm`` (default ``key``) names its severity;
        ``kwargs`` give its condition (and may set its comparison, periods and missing data)."""
        args = self._args
        topic_arn = self.topic_arns[args.severities[alarm or key]]
        condition: dict[str, Any] = {
            "comparison_operator": "GreaterThanThreshold",
            "evaluation_periods": EVALUATION_PERIODS,
            "datapoints_to_alarm": DATAPOINTS_TO_ALARM,
            "treat_missing_data": "notBreaching",
            **kwargs,
        }
        aws.cloudwatch.MetricAlarm(
            f"{self._name}-{key}",
            name=f"frontier-{args.stack}-{key}",
            alarm_description=description,
            alarm_actions=[topic_arn],
            ok_actions=[topic_arn],
            tags=dict(args.tags),
            opts=self._child,
            **condition,
        )

    def _named_alarms(self) -> None:
        """The alarms every target raises under the same names, as their declaration reads on EC2."""
        args = self._args
        for alarm in NAMED_ALARMS.values():
            condition = alarm.cloudwatch(args.settings)
            places = (
                [(suffix, runtime_dimensions(args.stack, group)) for group, suffix in self._serving_groups()]
                if condition.per_node_group
                else [("", {CLOUDWATCH_DIMENSIONS[0]: args.stack})]
            )
            for suffix, dims in places:
                self._alarm(
                    f"{alarm.name}{suffix}",
                    f"{alarm.fires} (threshold {alarm.threshold(args.settings):g})".replace("`", ""),
                    alarm=alarm.name,
                    **condition.alarm_inputs(dims),
                )

    def _alarms(self) -> None:
        args, slo = self._args, self._args.slo
        self._alarm(
            "5xx-rate",
            f"5xx responses above the SLO error rate ({slo.error_rate:.2%}) for 3 of 5 minutes",
            threshold=slo.error_rate,
            metric_queries=error_rate_queries(args.alb_arn_suffix),
        )
        self._alarm(
            "unhealthy-hosts",
            f"More runtime hosts fail the readiness check than a rollout takes out ({args.unhealthy_allowance})",
            threshold=args.unhealthy_allowance,
            **self._unhealthy_hosts(),
        )
        for group, suffix in self._serving_groups():
            self._runtime_alarms(group, suffix)

    def _unhealthy_hosts(self) -> dict[str, Any]:
        """The hosts of the ALB's target group that fail its health check, at their most each minute:
        the runtimes', or the gateway's where one fronts them."""
        args = self._args
        lb_and_tg = {"LoadBalancer": args.alb_arn_suffix, "TargetGroup": args.target_group_arn_suffix}
        return series(ALB_NAMESPACE, "UnHealthyHostCount", lb_and_tg, statistic="Maximum")

    def _serving_groups(self) -> list[tuple[str, str]]:
        """Each serving group, and what its alarms' names end in: nothing where it is the only one."""
        groups = self._args.serving_groups
        return [(group, "" if len(groups) == 1 else f"-{group}") for group in groups]

    def _runtime_alarms(self, group: str, suffix: str) -> None:
        """What one serving group's runtimes publish: p99 latency and queue depth (the named alarms read the rest)."""
        args, slo = self._args, self._args.slo
        runtime = runtime_dimensions(args.stack, group)
        self._alarm(
            f"p99-latency{suffix}",
            f"p99 end-to-end request latency above the SLO ({slo.p99_latency_ms:.0f} ms) for 3 of 5 minutes",
            alarm="p99-latency",
            threshold=slo.p99_latency_ms,
            # Milliseconds, from the runtime's histogram.
            **series(METRIC_NAMESPACE, E2E_LATENCY_CW_METRIC, runtime, extended_statistic="p99"),
        )
        self._alarm(
            f"queue-depth{suffix}",
            f"Requests waiting in a runtime's queue above {args.queue_depth_alarm}",
            alarm="queue-depth",
            threshold=args.queue_depth_alarm,
            **series(METRIC_NAMESPACE, QUEUE_DEPTH_METRIC, runtime, statistic="Maximum"),
        )

    def _gateway_alarms(self) -> None:
        """The gateway's hosts: its own error rate, its hosts' health in the target group, their CPU."""
        args, slo = self._args, self._args.slo
        gateway = runtime_dimensions(args.stack, GATEWAY_NODE_GROUP)
        self._alarm(
            "gateway-5xx-rate",
            f"The gateway answers more than {slo.error_rate:.2%} of requests with a 5xx "
            "(its own count: held requests that timed out, runtimes that failed) for 3 of 5 minutes",
            threshold=slo.error_rate,
            metric_queries=gateway_error_rate_queries(gateway),
        )
        self._alarm(
            "gateway-unhealthy-hosts",
            "A gateway host fails the target group's HTTPS health check (a gateway roll keeps every "
            "host healthy: each replacement passes it before an old host goes)",
            threshold=0,
            **self._unhealthy_hosts(),
        )
        self._alarm(
            "gateway-cpu",
            f"A gateway host's CPU is busier than {GATEWAY_CPU_PERCENT:.0f} % for 3 of 5 minutes",
            threshold=GATEWAY_CPU_PERCENT,
            **agent_series(host.CPU_ACTIVE, gateway),
        )

    def _resource_alarms(self) -> None:
        """Per node group, on the CloudWatch agent's series rolled up over the group's hosts: the
        fullest host's memory and cache disk; on GPU groups the fullest GPU and the hottest one."""
        args, limits = self._args, self._args.limits
        for group, gpu in args.node_groups.items():
            dims = runtime_dimensions(args.stack, group)

            self._alarm(
                f"host-memory-{group}",
                f"A host of node group {group} uses more than {limits.host_memory:.0%} of its memory",
                alarm="host-memory",
                threshold=limits.host_memory * 100,  # the agent publishes percent
                **agent_series(host.MEM_USED, dims),
            )
            self._alarm(
                f"cache-disk-{group}",
                f"The weights cache's disk of a host of node group {group} is more than "
                f"{limits.cache_disk:.0%} full: the next model version may not fit",
                alarm="cache-disk",
                threshold=limits.cache_disk * 100,
                **agent_series(host.DISK_USED, dims),
            )
            if not gpu:
                continue
            self._alarm(
                f"gpu-memory-{group}",
                f"A GPU of node group {group} uses more than {limits.gpu_memory:.0%} of its memory, beyond "
                "what the runtime claims at start: another process or a leak",
                alarm="gpu-memory",
                threshold=limits.gpu_memory,
                metric_queries=gpu_memory_queries(dims),
            )
            self._alarm(
                f"gpu-temperature-{group}",
                f"A GPU of node group {group} is hotter than {limits.gpu_temperature_c:.0f} C",
                alarm="gpu-temperature",
                threshold=limits.gpu_temperature_c,
                **agent_series(host.GPU_TEMP, dims),
            )

    def _dashboard(self) -> aws.cloudwatch.Dashboard:
        args = self._args
        alb, tg = args.alb_arn_suffix, args.target_group_arn_suffix
        dims_of = {
            group: [part for pair in runtime_dimensions(args.stack, group).items() for part in pair]
            for group in args.serving_groups
        }

        def widget(title: str, metrics: list, y: int, x: int = 0, **props: Any) -> dict[str, Any]:
            return {
                "type": "metric",
                "x": x,
                "y": y,
                "width": 12,
                "height": 6,
                "properties": {
                    "title": title,
                    "region": args.region,
                    "metrics": metrics,
                    "period": PERIOD_S,
                    **props,
                },
            }

        def resource_widgets(y: int) -> list[dict[str, Any]]:
            """The resource panels of every target's dashboard (frontier.render.dashboards)."""
            gpu = any(args.node_groups.get(group, False) for group in args.serving_groups)
            shown = [p for p in resource_panels() if gpu or not p.title.startswith("GPU")]
            return [
                widget(
                    panel.title,
                    [
                        [host.HOST_NAMESPACE, one.metric, *dims, {"stat": one.stat}]
                        for dims in dims_of.values()
                        for one in panel.cloudwatch
                    ],
                    y + 6 * (i // 2),
                    12 * (i % 2),
                )
                for i, panel in enumerate(shown)
            ]

        body = {
            "widgets": [
                widget(
                    "Requests", [[ALB_NAMESPACE, "RequestCount", "LoadBalancer", alb, {"stat": "Sum"}]], 0
                ),
                widget(
                    "5xx",
                    [
                        [ALB_NAMESPACE, "HTTPCode_ELB_5XX_Count", "LoadBalancer", alb, {"stat": "Sum"}],
                        [ALB_NAMESPACE, "HTTPCode_Target_5XX_Count", "LoadBalancer", alb, {"stat": "Sum"}],
                    ],
                    0,
                    12,
                ),
                widget(
                    "Target response time p50 / p99 (s)",
                    [
                        [
                            ALB_NAMESPACE,
                            "TargetResponseTime",
                            "LoadBalancer",
                            alb,
                            "TargetGroup",
                            tg,
                            {"stat": stat},
                        ]
                        for stat in ("p50", "p99")
                    ],
                    6,
                    annotations={
                        "horizontal": [{"label": "SLO p99", "value": args.slo.p99_latency_ms / 1000}]
                    },
                ),
                widget(
                    "Healthy / unhealthy hosts",
                    [
                        [
                            ALB_NAMESPACE,
                            "HealthyHostCount",
                            "LoadBalancer",
                            alb,
                            "TargetGroup",
                            tg,
                            {"stat": "Minimum"},
                        ],
                        [
                            ALB_NAMESPACE,
                            "UnHealthyHostCount",
                            "LoadBalancer",
                            alb,
                            "TargetGroup",
                            tg,
                            {"stat": "Maximum"},
                        ],
                    ],
                    6,
                    12,
                ),
                widget(
                    "Runtime queue depth",
                    [
                        [METRIC_NAMESPACE, QUEUE_DEPTH_METRIC, *dims, {"stat": stat}]
                        for dims in dims_of.values()
                        for stat in ("Maximum", "Average")
                    ],
                    12,
                    annotations={"horizontal": [{"label": "alarm", "value": args.queue_depth_alarm}]},
                ),
                widget(
                    "Hosts in service",
                    [
                        [
                            "AWS/AutoScaling",
                            "GroupInServiceInstances",
                            "AutoScalingGroupName",
                            asg,
                            {"stat": "Average"},
                        ]
                        for asg in args.asg_names
                    ],
                    12,
                    12,
                ),
                *resource_widgets(18),
            ]
        }
        return aws.cloudwatch.Dashboard(
            f"{self._name}-dashboard",
            dashboard_name=f"frontier-{args.stack}",
            dashboard_body=pulumi.Output.json_dumps(body),
            opts=self._child,
        )
