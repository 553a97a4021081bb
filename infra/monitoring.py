"""Monitoring: log groups, the alarm topic, CloudWatch alarms against the stack's SLOs, a dashboard.

Alarms:
- ALB 5xx rate (ELB + target 5xx over requests, metric math) above ``slo.error_rate``;
- p99 end-to-end latency of whole requests above ``slo.p99_latency_ms``, from the runtime's own
  histogram (the ALB's TargetResponseTime is time to first byte for a stream);
- unhealthy hosts beyond what a rollout takes out at once (a rollout's own hosts do not page);
- runtime queue depth above ``monitoring.queue_depth_alarm``.

Each host's bootstrap (``frontier_hostside/bootstrap.py watch``) scrapes the runtime's /metrics and
publishes ``QueueDepth``, ``RunningRequests`` and ``EndToEndLatency`` (values with counts) in the
``Frontier/Runtime`` namespace under the dimensions ``Stack`` and ``NodeGroup`` (see
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
    QUEUE_DEPTH_METRIC,
    RESTARTS_CW_METRIC,
)
from frontier_hostside.names import CLOUDWATCH_NAMESPACE as METRIC_NAMESPACE

from frontier.config.schema import Slo

LOG_GROUP_ROOT = "/frontier"
ALB_NAMESPACE = "AWS/ApplicationELB"
PERIOD_S = 60
# One restart is a host healing itself; more than this a minute, on 3 of 5 minutes, is a crash loop.
RESTART_ALARM = 1
EVALUATION_PERIODS = 5
DATAPOINTS_TO_ALARM = 3


def runtime_dimensions(stack: str, node_group: str) -> dict[str, str]:
    return dict(zip(CLOUDWATCH_DIMENSIONS, (stack, node_group), strict=True))


@dataclass(frozen=True)
class MonitoringArgs:
    stack: str
    region: str
    slo: Slo
    queue_depth_alarm: int
    node_group: str
    # Hosts a rollout takes out of service at once: more unhealthy hosts than this is an incident.
    unhealthy_allowance: int
    alarm_email: str
    kms_key_arn: pulumi.Input[str]
    log_retention_days: int
    alb_arn_suffix: pulumi.Input[str]
    target_group_arn_suffix: pulumi.Input[str]
    asg_names: Sequence[pulumi.Input[str]]
    tags: Mapping[str, str]


def error_rate_queries(alb: pulumi.Input[str]) -> list[dict[str, Any]]:
    """(ELB 5xx + target 5xx) / requests per minute; no traffic is no data, not an error rate of 0/0."""

    def count(query_id: str, metric: str) -> dict[str, Any]:
        return {
            "id": query_id,
            "return_data": False,
            "metric": {
                "namespace": ALB_NAMESPACE,
                "metric_name": metric,
                "dimensions": {"LoadBalancer": alb},
                "period": PERIOD_S,
                "stat": "Sum",
            },
        }

    return [
        count("elb5xx", "HTTPCode_ELB_5XX_Count"),
        count("target5xx", "HTTPCode_Target_5XX_Count"),
        count("requests", "RequestCount"),
        {
            "id": "errorrate",
            "expression": "(FILL(elb5xx, 0) + FILL(target5xx, 0)) / requests",
            "label": "5xx / requests",
            "return_data": True,
        },
    ]


class Monitoring(pulumi.ComponentResource):
    topic_arn: pulumi.Output[str]
    runtime_log_group: pulumi.Output[str]
    dashboard_name: pulumi.Output[str]

    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:monitoring:Monitoring", name, None, opts)
        self._name, self._args = name, args
        self._child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)

        groups = {
            purpose: aws.cloudwatch.LogGroup(
                f"{name}-{purpose}",
                name=f"{LOG_GROUP_ROOT}/{args.stack}/{purpose}",
                retention_in_days=args.log_retention_days,
                kms_key_id=args.kms_key_arn,
                tags=tags,
                opts=self._child,
            )
            for purpose in ("runtime", "cloud-init")
        }
        topic = aws.sns.Topic(
            f"{name}-alarms",
            display_name=f"Frontier {args.stack} alarms",
            kms_master_key_id=args.kms_key_arn,
            tags=tags,
            opts=self._child,
        )
        if args.alarm_email:
            # Email subscriptions stay pending until the recipient confirms the mail AWS sends.
            aws.sns.TopicSubscription(
                f"{name}-alarms-email",
                topic=topic.arn,
                protocol="email",
                endpoint=args.alarm_email,
                opts=self._child,
            )
        self._alarms(topic.arn)
        dashboard = self._dashboard()

        self.topic_arn = topic.arn
        self.runtime_log_group = groups["runtime"].name
        self.dashboard_name = dashboard.dashboard_name
        self.register_outputs({"topic_arn": topic.arn, "dashboard": dashboard.dashboard_name})

    def _alarm(self, key: str, description: str, topic_arn: pulumi.Output[str], **kwargs: Any) -> None:
        args = self._args
        aws.cloudwatch.MetricAlarm(
            f"{self._name}-{key}",
            name=f"frontier-{args.stack}-{key}",
            alarm_description=description,
            comparison_operator="GreaterThanThreshold",
            evaluation_periods=EVALUATION_PERIODS,
            datapoints_to_alarm=DATAPOINTS_TO_ALARM,
            treat_missing_data="notBreaching",
            alarm_actions=[topic_arn],
            ok_actions=[topic_arn],
            tags=dict(args.tags),
            opts=self._child,
            **kwargs,
        )

    def _alarms(self, topic_arn: pulumi.Output[str]) -> None:
        args, slo = self._args, self._args.slo
        lb_and_tg = {"LoadBalancer": args.alb_arn_suffix, "TargetGroup": args.target_group_arn_suffix}
        self._alarm(
            "5xx-rate",
            f"5xx responses above the SLO error rate ({slo.error_rate:.2%}) for 3 of 5 minutes",
            topic_arn,
            threshold=slo.error_rate,
            metric_queries=error_rate_queries(args.alb_arn_suffix),
        )
        runtime = runtime_dimensions(args.stack, args.node_group)
        self._alarm(
            "p99-latency",
            f"p99 end-to-end request latency above the SLO ({slo.p99_latency_ms:.0f} ms) for 3 of 5 minutes",
            topic_arn,
            namespace=METRIC_NAMESPACE,
            metric_name=E2E_LATENCY_CW_METRIC,  # milliseconds, from the runtime's histogram
            dimensions=runtime,
            extended_statistic="p99",
            period=PERIOD_S,
            threshold=slo.p99_latency_ms,
        )
        self._alarm(
            "unhealthy-hosts",
            f"More runtime hosts fail the readiness check than a rollout takes out ({args.unhealthy_allowance})",
            topic_arn,
            namespace=ALB_NAMESPACE,
            metric_name="UnHealthyHostCount",
            dimensions=lb_and_tg,
            statistic="Maximum",
            period=PERIOD_S,
            threshold=args.unhealthy_allowance,
        )
        self._alarm(
            "queue-depth",
            f"Requests waiting in a runtime's queue above {args.queue_depth_alarm}",
            topic_arn,
            namespace=METRIC_NAMESPACE,
            metric_name=QUEUE_DEPTH_METRIC,
            dimensions=runtime,
            statistic="Maximum",
            period=PERIOD_S,
            threshold=args.queue_depth_alarm,
        )
        self._alarm(
            "runtime-restarts",
            f"Runtimes restarted by their supervisor more than {RESTART_ALARM} times a minute "
            "(crash-looping or failing liveness)",
            topic_arn,
            namespace=METRIC_NAMESPACE,
            metric_name=RESTARTS_CW_METRIC,
            dimensions=runtime,
            statistic="Sum",
            period=PERIOD_S,
            threshold=RESTART_ALARM,
        )

    def _dashboard(self) -> aws.cloudwatch.Dashboard:
        args = self._args
        alb, tg = args.alb_arn_suffix, args.target_group_arn_suffix
        dims = [part for pair in runtime_dimensions(args.stack, args.node_group).items() for part in pair]

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
                            {"stat": "p50"},
                        ],
                        [
                            ALB_NAMESPACE,
                            "TargetResponseTime",
                            "LoadBalancer",
                            alb,
                            "TargetGroup",
                            tg,
                            {"stat": "p99"},
                        ],
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
            ]
        }
        return aws.cloudwatch.Dashboard(
            f"{self._name}-dashboard",
            dashboard_name=f"frontier-{args.stack}",
            dashboard_body=pulumi.Output.json_dumps(body),
            opts=self._child,
        )
